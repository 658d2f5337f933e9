"""What one experiment is, validated: a model shape, a parallel plan, a workload and an environment.

    spec = ExperimentSpec.parse({"model": "tiny", "plan": {"algorithm": "ring", "world": 4},
                                 "workload": {"seq_len": 2048}})
    spec.hash        # stable content hash: the same experiment always gets the same 12 hex digits
    spec.to_trial("sweep-1a2b3c4d")   # the case.Trial the runner, the gang and every rank carry

Validating a spec makes its `case.Trial` (the case and its placement), once: every rule of a trial
lives there (`Case.validate`, the algorithm's own rules in `seqpar.algorithms.check`, the placement
in `case.Trial`), and this module only adds the rules of the workload's mask (`documents`: packed
documents, explicit or a seeded long-tailed draw, summing to seq_len; `window`: a causal sliding
window), maps each rule's field to where it lives in the spec and turns pydantic's errors into the
one-line `ConfigError(field, value, rule)` the CLI prints. Any seq_len runs, in every layout: a
length that does not split over the ranks runs as one document [0, N], on uneven shards.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.case import Case, TrainCase, Trial
from seqpar.errors import ConfigError, SeqparError
from seqpar.experiments.corpora import train_on
from seqpar.experiments.sections import (  # noqa: F401  (re-exported: the spec's sections)
    ClusterTwin,
    CorpusSource,
    Documents,
    Environment,
    LinkSpec,
    TextSource,
    TrainSpec,
    Workload,
    _rule,
    _Strict,
    resolve_text,
    shipped_texts,
)
from seqpar.experiments.steps import dealt
from seqpar.rules.model import ModelConfig
from seqpar.rules.shape import SHAPE_PRESETS

Scalar = bool | int | float | str | None

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
            if name not in SHAPE_PRESETS:
                raise PydanticCustomError("seqpar_rule", "{rule}", {
                    "field": "model.preset", "value": name,
                    "rule": f"must be one of {', '.join(SHAPE_PRESETS)}"})
            data = {**SHAPE_PRESETS[name], **data}
        return data

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


class ParallelPlan(_Strict):
    algorithm: str = Field(description="a name in seqpar.algorithms.REGISTRY, or auto (dynamic "
                           "SP: each group size the one the planner predicts fastest)")
    world: int = Field(gt=0, description="ranks in the sequence-parallel group P")
    layout: str = Field("zigzag", description="contiguous | zigzag | stripe")
    options: dict[str, Scalar] = Field(default_factory=dict,
                                       description="algorithm options (dhp, dcp, placement, ...)")
    nodes: int = Field(1, gt=0, description="nodes the ranks are spread over (virtual on one host)")
    ranks_per_node: int | None = Field(None, gt=0, description="default world / nodes")
    # a step of variable-length sequences (workload.lengths; docs/lengths.md)
    sp_policy: Literal["static", "dynamic"] = Field(
        "static", description="static: one SP degree (world / train.dp), sequences packed; "
                              "dynamic: each sequence on the smallest group that holds it")
    packing: Literal["best-fit", "cost-balanced"] = Field(
        "best-fit", description="static packs: best-fit by tokens, or by predicted work (WLB-LLM)")
    capacity: int | None = Field(None, gt=0, description="tokens a rank holds in a micro-batch "
                                 "(default: seq_len / the static SP degree)")
    equal_counts: bool = Field(False, description="dynamic: every rank runs as many micro-batches "
                               "(FSDP's gathers need it)")
    group_sizes: Literal["power-of-two", "any"] = Field(
        "power-of-two", description="dynamic groups: powers of two and the pool (Megatron-LM), or "
                                    "any size (ByteScale)")
    degrees: Literal["smallest", "cost"] = Field(
        "smallest", description="dynamic: each sequence on the smallest group that holds it "
                                "(Megatron-LM), or larger groups where the step's predicted "
                                "makespan falls (FlexSP, ByteScale)")
    ep: int = Field(1, gt=0, description="expert parallelism (train): each MoE layer's experts "
                    "spread over EP groups of ep consecutive DP x SP ranks (model.ep)")

    def changed_varlen_field(self) -> str | None:
        """The first field of a step of lengths not at its default (None: all are: old hashes)."""
        return next((k for k in VARLEN_PLAN_FIELDS
                     if getattr(self, k) != type(self).model_fields[k].default), None)


VARLEN_PLAN_FIELDS = ("sp_policy", "packing", "capacity", "equal_counts", "group_sizes", "degrees")


# ConfigError fields from algorithms.check -> where they live in an ExperimentSpec
_FIELD_HOME = {"batch": "workload.batch", "seq_len": "workload.seq_len", "heads": "model.heads",
               "kv_heads": "model.kv_heads", "head_dim": "model.head_dim",
               "algorithm": "plan.algorithm", "layout": "plan.layout", "world": "plan.world",
               "option": "plan.options", "backend": "env.backend",
               "cu_seqlens": "workload.documents", "nodes": "plan.nodes",
               "ranks_per_node": "plan.ranks_per_node", "timeout_s": "env.timeout_s",
               "env_vars": "env.vars", "link_emulation": "env.link_emulation"}
# the gang a spec's trial names until a runner puts it in its own (`to_trial(gang_id)`)
UNASSIGNED_GANG = "unassigned"


class ExperimentSpec(_Strict):
    model: ModelShape = Field(description="the attention shape; a training trial's is its "
                                          "train.model's (the section may be left out)")
    plan: ParallelPlan
    workload: Workload
    env: Environment = Field(default_factory=Environment)
    train: TrainSpec | None = None

    _trial: Trial = PrivateAttr()  # made (and validated) once, by _rules

    @model_validator(mode="before")
    @classmethod
    def _shape_of_train_model(cls, data: Any) -> Any:
        """A training trial without a model section takes its model's attention shape (the
        preset, YAML or config.json of train.model already says it)."""
        if not (isinstance(data, dict) and data.get("model") is None
                and isinstance(data.get("train"), dict)):
            return data
        name = data["train"].get("model", TrainSpec.model_fields["model"].default)
        if not isinstance(name, str):
            return data  # the train section's own validation names it
        try:
            cfg = ModelConfig.load(name)
        except ConfigError as err:
            raise _rule("train.model", err.value, err.rule) from None
        return {**data, "model": {"heads": cfg.heads, "kv_heads": cfg.kv_heads,
                                  "head_dim": cfg.head_dim}}

    @model_validator(mode="after")
    def _rules(self) -> ExperimentSpec:
        if self.train is None and self.workload.data is not None:
            data = self.workload.data
            raise _rule("workload.data", data.text if isinstance(data, TextSource) else data.corpus,
                        "text or corpus data trains a model: it needs a train section")
        if self.train is None and self.workload.lengths is not None:
            raise _rule("workload.lengths", self.workload.lengths,
                        "a step of variable-length sequences trains a model: it needs a train section")
        if self.train is None and self.plan.ep != 1:
            raise _rule("plan.ep", self.plan.ep, "spreads a model's experts: it needs a train section")
        changed = self.plan.changed_varlen_field()
        if self.workload.lengths is None and changed is not None:
            raise _rule(f"plan.{changed}", getattr(self.plan, changed),
                        "needs workload.lengths (a step of variable-length sequences)")
        if self.train is not None:
            w = self.workload
            docs = w.documents.model_dump(exclude_none=True) if w.documents else None
            for name, value, ok in (("documents", docs, w.documents is None),
                                    ("window", w.window, w.window is None or w.lengths is not None),
                                    ("mode", w.mode, w.mode != "accuracy")):
                if not ok:
                    raise _rule(f"workload.{name}", value, "a training trial (train) takes one "
                                "document, no window and mode fwd+bwd")
            self._trial = _train_trial(self)
            return self
        try:
            self._trial = self._placed(self._case())
        except ConfigError as err:
            home = _FIELD_HOME.get(err.field.split("[")[0])
            if home is None and "." not in err.field:
                home = f"plan.options.{err.field}"  # an algorithm's own option, e.g. dhp
            rule = err.rule.replace("with cu_seqlens", "with workload.documents")
            raise _rule(home or err.field, err.value, rule) from None
        return self

    def _case(self) -> Case:
        w, m = self.workload, self.model
        return Case(self.plan.algorithm, self.plan.world, self.plan.layout, w.causal, w.batch,
                    w.seq_len, m.heads, m.hkv, m.head_dim, w.dtype, w.seed,
                    tuple(sorted(self.options.items())), w.mode, w.warmup, w.iters,
                    w.cu_seqlens or (), w.window, w.mask_spec)

    def _placed(self, case: Case | TrainCase) -> Trial:
        """The trial of `case` with this spec's placement (validated here, once)."""
        return Trial(case, UNASSIGNED_GANG, self.plan.nodes, self.plan.ranks_per_node,
                     self.env.link_models(self.workload.dtype) or {}, self.env.timeout_s,
                     dict(self.env.vars))

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
        exclude: dict[str, Any] = {"env": env_out, "model": {"preset"}}
        # fields added later, absent from older specs' hashes while they hold their defaults
        w = self.workload
        late = {"mask"} if w.mask is None else set()
        if w.lengths is None:
            late |= {"lengths", "tokens_per_step", "batches"}
        exclude["workload"] = late
        exclude["plan"] = ({"ep"} if self.plan.ep == 1 else set()) | (  # hashed when set
            set(VARLEN_PLAN_FIELDS) if self.plan.changed_varlen_field() is None else set())
        if self.train is not None:
            defaults = {"tiled": False, "mla_pass": "kv", "linear_sp": None}  # hashed when set
            exclude["train"] = {k for k, v in defaults.items() if getattr(self.train, k) == v}
        data = self.model_dump(mode="json", exclude=exclude)
        data["model"]["kv_heads"] = self.model.hkv
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_trial(self, gang_id: str) -> Trial:
        """The trial this spec describes, in the gang `gang_id` (validated when the spec was)."""
        return self._trial.in_gang(gang_id)

    def to_case(self) -> Case | TrainCase:
        """The trial's case (what the planner and the labels read)."""
        return self._trial.case

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
    w, p = spec.workload, spec.plan
    case = _plain_train_case(spec)
    if w.lengths is None:
        return case
    rpn = p.ranks_per_node or max(1, p.world // p.nodes)
    return dealt(case, w.lengths, tokens=w.tokens_per_step, batches=w.batches,
                 policy=p.sp_policy, packing=p.packing, capacity=p.capacity,
                 equal_counts=p.equal_counts, any_size=p.group_sizes == "any",
                 degrees=p.degrees, nodes=p.nodes,
                 ranks_per_node=rpn if p.nodes > 1 or p.ranks_per_node else None,
                 window=w.window, resolve=resolve_text)


def _plain_train_case(spec: ExperimentSpec) -> TrainCase:
    t, w, p = spec.train, spec.workload, spec.plan
    assert t is not None
    text = w.data if isinstance(w.data, TextSource) else None
    case = TrainCase(algorithm=p.algorithm, sp=p.world // t.dp, dp=t.dp, layout=p.layout,
                     model=t.model, model_overrides=t.overrides(), seq_len=w.seq_len, batch=w.batch,
                     dtype=w.dtype, checkpoint=t.checkpoint, seq_fraction=t.seq_fraction,
                     fused_head=t.fused_head, options=tuple(sorted(spec.options.items())),
                     warmup=w.warmup, iters=w.iters, seed=w.seed, lr=t.lr, states=t.states,
                     master_dtype=t.master_dtype, ep=p.ep,
                     offload=tuple(t.offload) if isinstance(t.offload, list) else t.offload,
                     tiled=t.tiled, mask=w.mask_spec, mla_pass=t.mla_pass, linear_sp=t.linear_sp,
                     text=text.path() if text is not None else None,
                     text_separator=text.separator if text is not None else "\n\n")
    if isinstance(w.data, CorpusSource) and w.lengths is None:  # with lengths: dealt reads it
        case, _ = train_on(case, w.data.ref, "workload.data.corpus")
    return case


_TRAIN_HOME = {"sp": "plan.world", "dp": "train.dp", "checkpoint": "train.checkpoint",
               "seq_fraction": "train.seq_fraction", "model": "train.model",
               "states": "train.states", "master_dtype": "train.master_dtype",
               "offload": "train.offload", "vocab": "train.vocab", "capacity": "plan.capacity",
               "mla_pass": "train.mla_pass", "linear_sp": "train.linear_sp",
               "sp_policy": "plan.sp_policy", "packing": "plan.packing",
               "degrees": "plan.degrees", "ep": "plan.ep",
               "degree": "plan.world", "sp_group": "plan.world", "lengths": "workload.lengths",
               "tokens_per_step": "workload.tokens_per_step", "batches": "workload.batches"}


def _train_trial(spec: ExperimentSpec) -> Trial:
    """A training trial: dp divides world, the model section is the decoder's attention shape,
    and every rule of the trial (checkpoint mode, the algorithm on SP = world / dp ranks, the
    placement)."""
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
                              f"shape (heads, kv_heads, head_dim) = {shape}, or left out")
        return spec._placed(case)
    except ConfigError as err:
        field = err.field.split("[")[0]
        home = _TRAIN_HOME.get(field) or _FIELD_HOME.get(field, err.field)
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


def _param_value(text: str) -> Any:
    """A param as MLflow stores it (str(value)) back to the value."""
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def spec_of_params(params: Mapping[str, str]) -> ExperimentSpec:
    """Rebuild an ExperimentSpec from a trial's flat MLflow params (plan.options.dhp, ...)."""
    data: dict[str, Any] = {}
    for key, text in params.items():
        parts = key.split(".")
        if parts[0] not in ("model", "plan", "workload", "env", "train"):
            continue
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _param_value(text)
    data.get("model", {}).pop("preset", None)
    return ExperimentSpec.parse(data)


def specs_of(trials: Iterable[tuple[Mapping[str, str], Mapping[str, float]]],
             ) -> Iterator[tuple[ExperimentSpec, Mapping[str, float]]]:
    """(params, metrics) of logged trials -> (ExperimentSpec, metrics), the ones whose params no
    longer make a valid spec (an older seqpar's) left out: what `planner.plan.validate` takes."""
    for params, metrics in trials:
        try:
            yield spec_of_params(params), metrics
        except SeqparError:
            continue
