"""The sections of an experiment spec besides the model and the plan: the workload (its mask: packed
documents, a window; its data: real text), the environment (device, kernels, link emulation, the
ranks' environment variables) and a training trial's `train` section. `spec.ExperimentSpec` puts
them together; pydantic, strict, a misspelt key is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from seqpar.algorithms.base import DTYPES
from seqpar.algorithms.comm import LinkModel
from seqpar.corpus.cache import lengths_file, open_corpus
from seqpar.errors import ConfigError
from seqpar.planner import clusters
from seqpar.rules import lengths as length_rules
from seqpar.rules import masks
from seqpar.rules.lengths import boundaries, split_total


class _Strict(BaseModel):
    # strict: "4" is not 4 and true is not 1; forbid: a misspelt key is an error, not a default
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _rule(field: str, value: Any, rule: str) -> PydanticCustomError:
    """A seqpar rule broken inside a validator (config_error turns it into a ConfigError)."""
    return PydanticCustomError("seqpar_rule", "{rule}", {"field": field, "value": value,
                                                         "rule": rule})


class Documents(_Strict):
    """Packed documents in one sequence of seq_len: attention stays inside each. Explicit
    `lengths`, or `count` lengths drawn from the seeded log-normal of `workload.lengths` (sigma;
    `spread` is its older name) and scaled to fill the sequence (`rules.lengths.split_total`): one
    static pack of a long-tailed draw."""

    count: int | None = Field(None, gt=0, description="documents to draw (with sigma and seed)")
    spread: float = Field(1.25, ge=0, validation_alias=AliasChoices("spread", "sigma"),
                          description="sigma of the log-normal draw (the same sigma as "
                                      "workload.lengths' lognormal; also written sigma): 0 = "
                                      "equal lengths")
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
        assert self.count is not None
        return split_total(seq_len, self.count, self.spread, self.seed)


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


class CorpusSource(_Strict):
    """A user's corpus as training data: its documents through its tokenizer (seqpar.corpus; the
    model's vocabulary the tokenizer's unless train.vocab gives a larger one), packed into
    sequences of seq_len as a text's are. Read and tokenized on the driver, once (cached)."""

    corpus: str = Field(description="a .parquet/.jsonl/.arrow/.csv/.txt file, a folder of them or "
                                    "a folder datasets.save_to_disk wrote (docs/lengths.md)")
    tokenizer: str = Field(description="a tokenizer.json or a local folder holding one")
    column: str = Field("text", min_length=1, description="the column holding the text")
    limit: int | None = Field(None, gt=0, description="read only the first N documents")

    @model_validator(mode="after")
    def _readable(self) -> CorpusSource:
        try:
            open_corpus(self.ref, "workload.data.corpus", tokenizer_field="workload.data.tokenizer",
                        column_field="workload.data.column")
        except ConfigError as err:
            raise _rule(err.field, err.value, err.rule) from None
        return self

    @property
    def ref(self) -> length_rules.CorpusRef:
        return length_rules.CorpusRef(self.corpus, self.tokenizer, self.column, self.limit)


def _data_kind(value: Any) -> str:
    corpus = isinstance(value, CorpusSource) or (isinstance(value, dict) and "corpus" in value)
    return "corpus" if corpus else "text"


class Workload(_Strict):
    seq_len: int = Field(gt=0, description="tokens in the whole sequence N (with lengths: "
                                           "default the longest sequence they give)")
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
    data: Annotated[Annotated[TextSource, Tag("text")] | Annotated[CorpusSource, Tag("corpus")],
                    Discriminator(_data_kind)] | None = Field(
        None, description="train on text: {text: PATH} (bytes) or a corpus: {corpus: SOURCE, "
                          "tokenizer: TOK, column: text} (training trials; None: seeded random "
                          "tokens)")
    mask: str | dict[str, Any] | None = Field(
        None, description="any attention mask: a compact form (window:W, block_sparse:B:D, "
                          "prefix_lm:P, ...) or {kind: ..., ...} (docs/masks.md); it takes the "
                          "place of causal, documents and window")
    lengths: str | None = Field(
        None, description="a step of whole sequences of these lengths (docs/lengths.md): "
                          "fixed:N | lognormal:mean=M,sigma=S,min=A,max=B | file:PATH | text:PATH "
                          "| corpus:SOURCE?tokenizer=TOK&column=text; "
                          "seq_len is then the longest sequence a step may hold (longer ones are "
                          "cut to it); training trials only")
    tokens_per_step: int | None = Field(
        None, gt=0, description="tokens a step trains on, all ranks together, in whole sequences "
                                "(the last one cut to fit; default: the pool's capacity, "
                                "plan.world x plan.capacity, at least seq_len)")
    batches: int = Field(2, gt=0, description="with lengths: distinct seeded batches the timed "
                                              "steps replay, each as often")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"must be one of {', '.join(DTYPES)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _longest_as_seq_len(cls, data: Any) -> Any:
        """With lengths and no seq_len, a step holds the longest sequence they give."""
        if not (isinstance(data, dict) and data.get("seq_len") is None
                and isinstance(data.get("lengths"), str)):
            return data
        try:
            dist = length_rules.parse(data["lengths"], "workload.lengths", resolve_text,
                                      corpus=lengths_file)
        except ConfigError as err:
            raise _rule(err.field, err.value, err.rule) from None
        return {**data, "seq_len": dist.high}

    @model_validator(mode="after")
    def _mask_rules(self) -> Workload:
        if self.lengths is not None:
            self._lengths_rules()
        elif self.tokens_per_step is not None or self.batches != 2:
            raise _rule("workload.tokens_per_step" if self.tokens_per_step is not None else
                        "workload.batches", self.tokens_per_step or self.batches,
                        "needs workload.lengths (a step of variable-length sequences)")
        if self.mask is not None:
            if self.documents is not None or self.window is not None or not self.causal:
                raise _rule("workload.mask", self.mask_spec if isinstance(self.mask, str)
                            else self.mask, "takes the place of causal, documents and window "
                            "(give those as mask kinds: documents:L1,L2,..., window:W, full)")
            try:
                masks.parse(self.mask, self.seq_len)
            except ConfigError as err:
                part = err.field.removeprefix("mask").lstrip(".")
                raise _rule("workload.mask" + (f".{part}" if part else ""), err.value,
                            err.rule) from None
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

    def length_dist(self) -> length_rules.Distribution | None:
        """The lengths' distribution (None: one sequence of seq_len); `shipped:NAME` texts
        resolve to the shipped files."""
        if self.lengths is None:
            return None
        return length_rules.parse(self.lengths, "workload.lengths", resolve_text,
                                  corpus=lengths_file)

    @property
    def mask_spec(self) -> str:
        """The mask as its compact form ('': none, the causal/full relation)."""
        if self.mask is None:
            return ""
        return masks.as_spec(masks.parse(self.mask, self.seq_len))

    def _lengths_rules(self) -> None:
        """What combines with lengths (docs/lengths.md): a window inside each sequence; not
        documents (the sequences are the documents of each pack), a mask or text data (give a
        text as lengths: text:PATH); a corpus as data only with its own documents as lengths;
        the distribution's own parameters."""
        for name in ("documents", "mask", "data"):
            if name == "data" and isinstance(self.data, CorpusSource):
                continue
            if getattr(self, name) is not None:
                raise _rule(f"workload.{name}", "given", "does not combine with workload.lengths "
                            "(the sequences are the packs' documents; a window may be given; a "
                            "text is lengths: text:PATH)")
        try:
            dist = self.length_dist()
        except ConfigError as err:
            raise _rule(err.field, err.value, err.rule) from None
        assert dist is not None
        if isinstance(self.data, CorpusSource) and dist.spec != f"corpus:{self.data.ref.body}":
            raise _rule("workload.lengths", self.lengths, "with a corpus as data, the sequences "
                        f"are its documents: corpus:{self.data.ref.body} (or omit workload.data: "
                        "corpus: lengths train on the corpus's own tokens)")
        shortest = dist.low
        if self.tokens_per_step is not None and self.tokens_per_step < min(shortest, self.seq_len):
            raise _rule("workload.tokens_per_step", self.tokens_per_step,
                        f"must hold at least the shortest sequence ({min(shortest, self.seq_len)} "
                        "tokens)")
        if not self.causal:
            raise _rule("workload.causal", self.causal, "a step of sequences trains causally")

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        """Global document boundaries [0, ..., N], or None for one document."""
        if self.documents is None:
            return None
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
    backend: str = Field("auto", description="local attention kernel: auto | flash | torch | cudnn "
                                             "| math")
    link_emulation: dict[Literal["intra", "inter"], LinkSpec] | ClusterTwin | None = None
    timeout_s: float = Field(300.0, gt=0)
    vars: dict[str, str] = Field(default_factory=dict, description="environment variables every "
                                 "rank starts with, e.g. NCCL_SOCKET_IFNAME: eth0 (beside the "
                                 "driver's communication variables; case.Trial checks the names)")

    def emulated_links(self, dtype: str = "float32") -> dict[str, LinkSpec] | None:
        """The emulated link classes; a ClusterTwin becomes its cluster's links scaled here."""
        if not self.link_emulation:
            return None
        if isinstance(self.link_emulation, ClusterTwin):
            tw = clusters.twin(clusters.load(self.link_emulation.cluster),
                               clusters.load(self.link_emulation.local), dtype)
            return {k: LinkSpec(latency_us=getattr(tw, k).latency_us,
                                bandwidth_gb_per_s=getattr(tw, k).bandwidth_gb_per_s)
                    for k in ("intra", "inter")}
        return dict(self.link_emulation)

    def link_models(self, dtype: str = "float32") -> dict[str, LinkModel] | None:
        """The emulated link classes as the ranks' Comms take them (None: none)."""
        links = self.emulated_links(dtype)
        if not links:
            return None
        return {k: LinkModel(v.latency_us / 1e6, v.bandwidth_gb_per_s * 1e9)
                for k, v in links.items()}


class TrainSpec(_Strict):
    """A model training trial instead of one attention call: `train.model` is the
    decoder (a `seqpar.model` preset), trained with the plan's algorithm over world / dp ranks."""

    model: str = Field("tiny", description="a preset (tiny, llama3.1-8b, qwen2.5-14b, ...), a YAML "
                                           "of ModelConfig's fields or a Hugging Face config.json")
    vocab: int | None = Field(None, gt=0, description="override the preset's vocabulary")
    checkpoint: str = Field("none", description="none | full | sc++ | sequence | sc++,sequence | "
                                                "seq-attn (BurstEngine §3.2)")
    seq_fraction: float = Field(0.5, ge=0, le=1, description="sequence modes: the part of each "
                                "rank's token-wise layers recomputed; seq-attn: the prefix F whose "
                                "attention backward re-runs (stripe any F, zigzag 0.5)")
    fused_head: bool = False
    dp: int = Field(1, gt=0, description="data-parallel replicas; SP = world / dp")
    lr: float = Field(1e-3, gt=0)
    states: Literal["replicated", "fsdp", "zero1", "dist-opt"] = Field(
        "replicated", description="model states: replicated on every rank, sharded by FSDP2 over "
                                  "the DP x SP world (a step of lengths: the pool), zero1: "
                                  "the optimizer's moments alone sharded over it (ZeRO-1), or "
                                  "dist-opt: Megatron's distributed optimizer on FSDP2 (gathered "
                                  "once a step, reduce-scattered once; no equal counts)")
    master_dtype: str | None = Field(None, description="fp32 master weights and moments for a "
                                                       "bf16 model: float32 (None: the model's dtype)")
    offload: bool | list[Literal["optimizer", "params", "activations"]] = Field(
        False, description="to host memory (CUDA): a list drawn from optimizer, params, "
                           "activations ([] none; true: FSDP2's CPU offload of the states)")
    tiled: bool = Field(False, description="the MLP over token tiles, recomputed per tile (ALST)")
    mla_pass: Literal["kv", "latent"] = Field(
        "kv", description="an MLA model (DeepSeek): what its ring carries, each rank's K,V or its "
                          "latent (kv_lora_rank + qk_rope_dim values a token, K,V rebuilt on "
                          "arrival; ring, double_ring, usp, burst, wallfacer)")
    linear_sp: Literal["lasp2", "lasp1"] | None = Field(
        None, description="a hybrid model's linear-attention layers (Qwen3-Next) under SP: LASP-2's "
                          "one all-gather of states a layer, or LASP-1's ring of states (none: "
                          "lasp2); the layout must be contiguous")

    def overrides(self) -> tuple[tuple[str, int], ...]:
        return (("vocab", self.vocab),) if self.vocab is not None else ()
