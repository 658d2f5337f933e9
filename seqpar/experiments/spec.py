"""What one experiment is, validated: a model shape, a parallel plan, a workload and an environment.

    spec = ExperimentSpec.parse({"model": "tiny", "plan": {"algorithm": "ring", "world": 4},
                                 "workload": {"seq_len": 2048}})
    spec.hash        # stable content hash: the same experiment always gets the same 12 hex digits
    spec.to_case()   # the plain Case the rank workers run

Every rule of the algorithm itself is checked by `seqpar.algorithms.check` (one place for the rules);
this module only adds the rules of the plan (nodes x ranks_per_node) and of the workload's mask
(`documents`: packed documents, explicit or a seeded long-tailed draw, summing to seq_len; `window`:
a causal sliding window), and turns pydantic's errors into the one-line
`ConfigError(field, value, rule)` the CLI prints. Any seq_len runs, in every layout: a length
that does not split over the ranks runs as one document [0, N], on uneven shards (`case.Case`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.case import Case, TrainCase
from seqpar.errors import ConfigError

Scalar = bool | int | float | str | None

# Shapes of one attention layer. `tiny` is what 2 CPU cores finish in seconds; the others are the
# papers' models (LoongTrain and WallFacer use 7B shapes; llama3-8b is the GQA case, H/Hkv = 4).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"heads": 8, "kv_heads": 8, "head_dim": 32},
    "tiny-gqa": {"heads": 8, "kv_heads": 2, "head_dim": 32},
    "llama2-7b": {"heads": 32, "kv_heads": 32, "head_dim": 128},
    "llama3-8b": {"heads": 32, "kv_heads": 8, "head_dim": 128},
    "llama3-70b": {"heads": 64, "kv_heads": 8, "head_dim": 128},
}


class _Strict(BaseModel):
    # strict: "4" is not 4 and true is not 1; forbid: a misspelt key is an error, not a default
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelShape(_Strict):
    """One attention layer's heads; a preset name (`tiny`, `llama2-7b`, ...) stands for all three."""

    heads: int = Field(8, gt=0, description="query heads H")
    kv_heads: int | None = Field(None, gt=0, description="key/value heads Hkv (default H: MHA)")
    head_dim: int = Field(32, gt=0, description="D")
    preset: str | None = Field(None, description="the preset this shape came from, if any")

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, str):
            data = {"preset": data}
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in PRESETS:
                raise PydanticCustomError("seqpar_rule", "{rule}", {
                    "field": "model.preset", "value": name,
                    "rule": f"must be one of {', '.join(PRESETS)}"})
            data = {**PRESETS[name], **data}
        return data

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


class ParallelPlan(_Strict):
    algorithm: str = Field(description="a name in seqpar.algorithms.REGISTRY")
    world: int = Field(gt=0, description="ranks in the sequence-parallel group P")
    layout: str = Field("zigzag", description="contiguous | zigzag | stripe")
    options: dict[str, Scalar] = Field(default_factory=dict,
                                       description="algorithm options (dhp, dcp, placement, ...)")
    nodes: int = Field(1, gt=0, description="nodes the ranks are spread over (virtual on one host)")
    ranks_per_node: int | None = Field(None, gt=0, description="default world / nodes")


def _rule(field: str, value: Any, rule: str) -> PydanticCustomError:
    """A seqpar rule broken inside a validator (config_error turns it into a ConfigError)."""
    return PydanticCustomError("seqpar_rule", "{rule}", {"field": field, "value": value,
                                                         "rule": rule})


class Documents(_Strict):
    """Packed documents: attention stays inside each. Explicit `lengths`, or `count` lengths drawn
    from a seeded log-normal (long-tailed: a few long, many short; experiments/documents.py)."""

    count: int | None = Field(None, gt=0, description="documents to draw (with spread and seed)")
    spread: float = Field(1.25, ge=0, description="sigma of the log-normal draw: 0 = equal lengths")
    seed: int = Field(0, ge=0, description="seed of the draw")
    lengths: list[int] | None = Field(None, description="explicit lengths in sequence order")

    @model_validator(mode="after")
    def _one_way(self) -> Documents:
        if (self.count is None) == (self.lengths is None):
            raise _rule("workload.documents", {"count": self.count, "lengths": self.lengths},
                        "give either count (a seeded draw) or lengths")
        if self.lengths is not None and not (self.lengths and all(n > 0 for n in self.lengths)):
            raise _rule("workload.documents.lengths", self.lengths,
                        "must be a non-empty list of positive lengths")
        return self

    def sizes(self, seq_len: int) -> tuple[int, ...]:
        """The document lengths of a sequence of seq_len tokens."""
        if self.lengths is not None:
            return tuple(self.lengths)
        from seqpar.experiments.documents import draw_lengths

        assert self.count is not None
        return draw_lengths(seq_len, self.count, self.spread, self.seed)


def shipped_texts() -> dict[str, str]:
    """name -> path of the texts in seqpar/experiments/texts."""
    folder = Path(__file__).parent / "texts"
    return {p.stem: str(p) for p in sorted(folder.glob("*.txt"))}


def resolve_text(value: str) -> str:
    if value.startswith("shipped:"):
        return shipped_texts().get(value.removeprefix("shipped:"), value)
    return value


class TextSource(_Strict):
    """Real text for a training trial: a UTF-8 file read as bytes (one token a byte, vocabulary
    256), documents split at `separator` and packed with their boundaries (seqpar.model.text)."""

    text: str = Field(description="path of a UTF-8 text file; 'shipped:NAME' for a text seqpar "
                                  "ships (" + ", ".join(sorted(shipped_texts())) + ")")
    separator: str = Field("\n\n", min_length=1, description="what separates two documents")

    @field_validator("text")
    @classmethod
    def _readable(cls, value: str) -> str:
        path = resolve_text(value)
        if not Path(path).is_file():
            raise ValueError(f"must be a readable text file (no file at {path})")
        return value

    def path(self) -> str:
        return resolve_text(self.text)


class Workload(_Strict):
    seq_len: int = Field(gt=0, description="tokens in the whole sequence N")
    batch: int = Field(1, gt=0)
    causal: bool = True
    dtype: str = Field("float32", description=" | ".join(DTYPES))
    mode: Literal["fwd", "fwd+bwd", "accuracy"] = Field(
        "fwd+bwd", description="accuracy: one fwd+bwd on fixed seeded inputs, out/dq/dk/dv "
                               "against a float64 single-process reference")
    warmup: int = Field(1, ge=0, description="untimed iterations first")
    iters: int = Field(3, gt=0, description="timed iterations")
    seed: int = Field(0, ge=0)
    documents: Documents | None = Field(None, description="packed documents (None: one)")
    window: int | None = Field(None, gt=0, description="sliding window W: query t sees keys "
                                                       "t-W+1..t (None: no window)")
    data: TextSource | None = Field(None, description="train on text: {text: PATH} (training "
                                                      "trials; None: seeded random tokens)")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"must be one of {', '.join(DTYPES)}")
        return value

    @model_validator(mode="after")
    def _mask_rules(self) -> Workload:
        if self.window is not None and not self.causal:
            raise _rule("workload.window", self.window,
                        "a sliding window needs causal=true (query t sees keys t-W+1..t)")
        d = self.documents
        if d is not None and d.count is not None and d.count > self.seq_len:
            raise _rule("workload.documents.count", d.count,
                        f"must be at most seq_len={self.seq_len} (every document holds a token)")
        if d is not None and d.lengths is not None and sum(d.lengths) != self.seq_len:
            raise _rule("workload.documents.lengths", d.lengths,
                        f"must sum to seq_len={self.seq_len} (they sum to {sum(d.lengths)})")
        return self

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        """Global document boundaries [0, ..., N], or None for one document."""
        if self.documents is None:
            return None
        from seqpar.experiments.documents import boundaries

        return boundaries(self.documents.sizes(self.seq_len))


class LinkSpec(_Strict):
    """An emulated link class: a transfer of b bytes takes latency + b / bandwidth."""

    latency_us: float = Field(0.0, ge=0)
    bandwidth_gb_per_s: float = Field(gt=0, description="GB/s = 1e9 bytes per second")


class ClusterTwin(_Strict):
    """Links of a cluster description scaled to this machine's compute (clusters.twin)."""

    cluster: str = Field(description="a cluster preset or YAML file, e.g. loongtrain-a100")
    local: str = Field("local", description="the measured cluster file of this machine")

    @model_validator(mode="after")
    def _known(self) -> ClusterTwin:
        from seqpar.experiments import clusters

        for name in ("cluster", "local"):
            try:
                clusters.load(getattr(self, name))
            except ConfigError as err:
                raise PydanticCustomError("seqpar_rule", "{rule}", {
                    "field": f"env.link_emulation.{name}", "value": err.value,
                    "rule": err.rule}) from None
        return self


class Environment(_Strict):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: str = Field("auto", description="local attention kernel: auto | flash | torch | math")
    link_emulation: dict[Literal["intra", "inter"], LinkSpec] | ClusterTwin | None = None
    timeout_s: float = Field(300.0, gt=0)
    vars: dict[str, str] = Field(default_factory=dict, description="environment variables every "
                                 "rank starts with, e.g. NCCL_SOCKET_IFNAME: eth0 (beside the "
                                 "driver's communication variables)")

    @field_validator("vars")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    def emulated_links(self, dtype: str = "float32") -> dict[str, LinkSpec] | None:
        """The emulated link classes; a ClusterTwin becomes its cluster's links scaled here."""
        if not self.link_emulation:
            return None
        if isinstance(self.link_emulation, ClusterTwin):
            from seqpar.experiments import clusters

            tw = clusters.twin(clusters.load(self.link_emulation.cluster),
                               clusters.load(self.link_emulation.local), dtype)
            return {k: LinkSpec(latency_us=getattr(tw, k).latency_us,
                                bandwidth_gb_per_s=getattr(tw, k).bandwidth_gb_per_s)
                    for k in ("intra", "inter")}
        return dict(self.link_emulation)

    def link_models(self, dtype: str = "float32") -> dict[str, Any] | None:
        links = self.emulated_links(dtype)
        if not links:
            return None
        from seqpar.algorithms.comm import LinkModel

        return {k: LinkModel(v.latency_us / 1e6, v.bandwidth_gb_per_s * 1e9)
                for k, v in links.items()}


class TrainSpec(_Strict):
    """A model training trial (issue 10) instead of one attention call: `train.model` is the
    decoder (a `seqpar.model` preset), trained with the plan's algorithm over world / dp ranks."""

    model: str = Field("tiny", description="tiny | llama2-7b | llama3-8b | 14b (seqpar.model)")
    vocab: int | None = Field(None, gt=0, description="override the preset's vocabulary")
    checkpoint: str = Field("none", description="none | full | sc++ | sequence | sc++,sequence")
    seq_fraction: float = Field(0.5, ge=0, le=1, description="sequence: part recomputed")
    fused_head: bool = False
    dp: int = Field(1, gt=0, description="data-parallel replicas; SP = world / dp")
    lr: float = Field(1e-3, gt=0)
    states: Literal["replicated", "fsdp"] = Field(
        "replicated", description="model states: replicated on every rank, or sharded by FSDP2 over "
                                  "the DP x SP world")
    master_dtype: str | None = Field(None, description="fp32 master weights and moments for a "
                                                       "bf16 model: float32 (None: the model's dtype)")
    offload: bool = Field(False, description="FSDP2's CPU offload of the sharded states (CUDA)")

    def overrides(self) -> tuple[tuple[str, int], ...]:
        return (("vocab", self.vocab),) if self.vocab is not None else ()


# ConfigError fields from algorithms.check -> where they live in an ExperimentSpec
_FIELD_HOME = {"batch": "workload.batch", "seq_len": "workload.seq_len", "heads": "model.heads",
               "kv_heads": "model.kv_heads", "head_dim": "model.head_dim",
               "algorithm": "plan.algorithm", "layout": "plan.layout", "world": "plan.world",
               "option": "plan.options", "backend": "env.backend",
               "cu_seqlens": "workload.documents"}


class ExperimentSpec(_Strict):
    model: ModelShape
    plan: ParallelPlan
    workload: Workload
    env: Environment = Field(default_factory=Environment)
    train: TrainSpec | None = None

    @model_validator(mode="after")
    def _rules(self) -> ExperimentSpec:
        if self.train is None and self.workload.data is not None:
            raise _rule("workload.data", self.workload.data.text,
                        "text data trains a model: it needs a train section")
        p = self.plan
        if self.train is not None:
            w = self.workload
            docs = w.documents.model_dump(exclude_none=True) if w.documents else None
            for name, value, ok in (("documents", docs, w.documents is None),
                                    ("window", w.window, w.window is None),
                                    ("mode", w.mode, w.mode != "accuracy")):
                if not ok:
                    raise _rule(f"workload.{name}", value, "a training trial (train) takes one "
                                "document, no window and mode fwd+bwd")
            _train_rules(self)
            return self
        try:
            rpn = p.ranks_per_node
            if rpn is None and p.world % p.nodes:
                raise ConfigError("plan.nodes", p.nodes, f"must divide world={p.world}")
            if rpn is not None and rpn * p.nodes != p.world:
                raise ConfigError("plan.ranks_per_node", rpn,
                                  f"nodes x ranks_per_node must equal world={p.world}")
            self.to_case().validate()
        except ConfigError as err:
            home = _FIELD_HOME.get(err.field)
            if home is None and "." not in err.field:
                home = f"plan.options.{err.field}"  # an algorithm's own option, e.g. dhp
            rule = err.rule.replace("with cu_seqlens", "with workload.documents")
            raise _rule(home or err.field, err.value, rule) from None
        return self

    # ------------------------------------------------------------------ derived
    @property
    def shape(self) -> AttnShape:
        w = self.workload
        return AttnShape(w.batch, w.seq_len, self.model.heads, self.model.hkv, self.model.head_dim,
                         DTYPES[w.dtype].itemsize)

    @property
    def options(self) -> dict[str, Scalar]:
        opts = dict(self.plan.options)
        if self.env.backend != "auto":
            opts["backend"] = self.env.backend
        return opts

    @property
    def hash(self) -> str:
        """12 hex digits of the canonical JSON of everything that changes the measurement."""
        env_out = {"timeout_s"} | (set() if self.env.vars else {"vars"})  # old hashes stay valid
        data = self.model_dump(mode="json", exclude={"env": env_out, "model": {"preset"}})
        data["model"]["kv_heads"] = self.model.hkv
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_case(self) -> Case | TrainCase:
        if self.train is not None:
            return _train_case(self)
        w, m = self.workload, self.model
        return Case(self.plan.algorithm, self.plan.world, self.plan.layout, w.causal, w.batch,
                    w.seq_len, m.heads, m.hkv, m.head_dim, w.dtype, w.seed,
                    tuple(sorted(self.options.items())), w.mode, w.warmup, w.iters,
                    w.cu_seqlens or (), w.window)

    def label(self) -> str:
        return self.to_case().label()

    def flat(self) -> dict[str, Scalar]:
        """Dotted keys -> values (MLflow params): plan.options.dhp, workload.seq_len, ..."""
        out: dict[str, Scalar] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = value

        data = self.model_dump(mode="json")
        data["model"]["kv_heads"] = self.model.hkv
        walk("", data)
        return out

    @classmethod
    def parse(cls, data: Any, where: str = "") -> ExperimentSpec:
        """Validate `data`; any problem raises one ConfigError naming the field path."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise config_error(err, where) from None


def _train_case(spec: ExperimentSpec) -> TrainCase:
    t, w, p = spec.train, spec.workload, spec.plan
    assert t is not None
    return TrainCase(algorithm=p.algorithm, sp=p.world // t.dp, dp=t.dp, layout=p.layout,
                     model=t.model, model_overrides=t.overrides(), seq_len=w.seq_len, batch=w.batch,
                     dtype=w.dtype, checkpoint=t.checkpoint, seq_fraction=t.seq_fraction,
                     fused_head=t.fused_head, options=tuple(sorted(spec.options.items())),
                     warmup=w.warmup, iters=w.iters, seed=w.seed, lr=t.lr, states=t.states,
                     master_dtype=t.master_dtype, offload=t.offload,
                     text=w.data.path() if w.data is not None else None,
                     text_separator=w.data.separator if w.data is not None else "\n\n")


_TRAIN_HOME = {"sp": "plan.world", "dp": "train.dp", "checkpoint": "train.checkpoint",
               "seq_fraction": "train.seq_fraction", "model": "train.model",
               "states": "train.states", "master_dtype": "train.master_dtype",
               "offload": "train.offload", "vocab": "train.vocab"}


def _train_rules(spec: ExperimentSpec) -> None:
    """A training trial: dp divides world, the model section is the decoder's attention shape,
    and every rule of the case (checkpoint mode, the algorithm on SP = world / dp ranks)."""
    t, p = spec.train, spec.plan
    assert t is not None
    try:
        if p.world % t.dp:
            raise ConfigError("train.dp", t.dp, f"must divide plan.world={p.world}")
        case = _train_case(spec)
        cfg = case.config()
        shape = (cfg.heads, cfg.kv_heads, cfg.head_dim)
        if (spec.model.heads, spec.model.hkv, spec.model.head_dim) != shape:
            raise ConfigError("model.shape", spec.model.preset or "custom",
                              f"a training trial's model section must be {t.model}'s attention "
                              f"shape (heads, kv_heads, head_dim) = {shape}")
        case.validate()
    except ConfigError as err:
        home = _TRAIN_HOME.get(err.field) or _FIELD_HOME.get(err.field, err.field)
        raise PydanticCustomError("seqpar_rule", "{rule}", {
            "field": home, "value": err.value, "rule": err.rule}) from None


def config_error(err: ValidationError, where: str = "") -> ConfigError:
    """The first problem of a pydantic ValidationError as a one-line ConfigError."""
    errors = err.errors(include_url=False)
    # a seqpar rule names its field best (in a union, pydantic lists every member's complaint)
    first = next((e for e in errors if e["type"] == "seqpar_rule"), errors[0])
    ctx = first.get("ctx") or {}
    if first["type"] == "seqpar_rule":
        field, value, rule = ctx["field"], ctx["value"], ctx["rule"]
    else:
        # a union's member tags ("dict[...]", "ClusterTwin", "[key]") are types, not fields
        parts = [str(p) for p in first["loc"]]
        kept = [p for p in parts if "[" not in p and not (p[:1].isupper() and p.isidentifier())]
        field = ".".join(kept) or "spec"
        value, rule = first.get("input"), first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            value, rule = field.rsplit(".", 1)[-1], "unknown key"
        elif first["type"] == "missing":
            value, rule = None, "is required"
    if where:
        field = f"{where}: {field}"
    return ConfigError(field, value, rule)
