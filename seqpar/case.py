"""What one trial is, as plain data: what a rank needs to run it, and every rule it must keep.

`Case` is one attention experiment on one process group (modes fwd, fwd+bwd, accuracy); `TrainCase`
is training steps of the decoder (mode train). Each has one `validate()` holding all its rules (the
algorithm's own rules come from `seqpar.algorithms.check`). `Trial` is a case with its placement
(nodes, ranks per node, emulated links, timeout, the ranks' environment variables) in an explicit
gang: made once (`ExperimentSpec.to_trial()`, or by hand), validated once, when it is made, and
carried unchanged from the sweep runner through the gang to every rank. The check, the benchmark
and the Ray rank workers (workers/) run them. It lives at the top of the package, beside the
errors, so that both layers use it without either importing the other.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.algorithms.comm import LinkModel
from seqpar.algorithms.layouts import call_cu
from seqpar.errors import require
from seqpar.model import checkpointing
from seqpar.model.config import ModelConfig
from seqpar.model.memory import TrainPolicy
from seqpar.model.states import StatePolicy
from seqpar.rules import masks
from seqpar.rules import pool as pool_rules
from seqpar.rules.deal import Batch
from seqpar.rules.grids import ranks_per_node_of
from seqpar.rules.memory import check_seq_attn, uses_fraction

MODES = ("fwd", "fwd+bwd", "accuracy")  # accuracy: errors against float64 (workers/measure/accuracy.py)


def _common_rules(world: int, dtype: str, warmup: int, iters: int) -> None:
    """The rules every trial keeps, whatever it measures."""
    require(isinstance(world, int) and world >= 1, "world", world, "must be a positive integer")
    require(dtype in DTYPES, "dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    require(isinstance(warmup, int) and warmup >= 0, "warmup", warmup,
            "must be a non-negative integer")
    require(isinstance(iters, int) and iters >= 1, "iters", iters, "must be a positive integer")


@dataclass(frozen=True)
class Case:
    algorithm: str
    world: int
    layout: str = "zigzag"
    causal: bool = True
    batch: int = 2
    seq_len: int = 48          # tokens in the whole sequence (all ranks together)
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 8
    dtype: str = "float64"
    seed: int = 0
    options: tuple[tuple[str, object], ...] = ()  # algorithm options, sorted (key, value) pairs
    mode: str = "fwd+bwd"
    warmup: int = 1
    iters: int = 3
    cu_seqlens: tuple[int, ...] = ()  # global document boundaries [0, ..., N]; () = one document
    window: int | None = None          # sliding window (None: none)
    mask: str = ""                     # any mask, its compact form (masks.SPECS; "": causal/full)

    def __post_init__(self) -> None:  # any length: uneven shards carry N as one document [0, N]
        if self.world > 0 and not self.mask:
            cu = call_cu(self.world, self.seq_len, self.cu_seqlens) or ()
            object.__setattr__(self, "cu_seqlens", cu)

    @property
    def shape(self) -> AttnShape:
        return AttnShape(self.batch, self.seq_len, self.heads, self.kv_heads, self.head_dim,
                         DTYPES[self.dtype].itemsize)

    @property
    def option_dict(self) -> dict[str, object]:
        return dict(self.options)

    @property
    def attention_mask(self) -> masks.Mask | None:
        """The mask this case's queries see (None: causal/full with its documents and window)."""
        return masks.parse(self.mask, self.seq_len) if self.mask else None

    def label(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options)
        mask = self.mask[:40] if self.mask else "causal" if self.causal else "full"
        if self.cu_seqlens:
            mask += f" docs={len(self.cu_seqlens) - 1}"
        if self.window is not None:
            mask += f" W={self.window}"
        return (f"{self.algorithm}{opts} P={self.world} {self.layout} {mask} N={self.seq_len} "
                f"H={self.heads}/{self.kv_heads} {self.dtype}")

    def validate(self) -> None:
        """Every rule of this case, before any actor starts (raises ConfigError): the trial's own
        (world, mode, dtype, iterations, window, documents) and the algorithm's
        (`seqpar.algorithms.check`). With documents (cu_seqlens) any length runs: the layout's
        seq_len rule relaxes (uneven shards are padded)."""
        _common_rules(self.world, self.dtype, self.warmup, self.iters)
        require(self.mode in MODES, "mode", self.mode, f"must be one of {', '.join(MODES)}")
        require(self.window is None or (isinstance(self.window, int) and self.window > 0),
                "window", self.window, "must be a positive integer (or None: no window)")
        if self.mask:
            require(not self.cu_seqlens and self.window is None, "mask", self.mask,
                    "takes the place of cu_seqlens and window (give documents and windows as "
                    "mask kinds)")
            m = self.attention_mask
            cu = layouts.call_cu(self.world, self.seq_len, m.cu)
            cu = None if cu is None else layouts.normal_cu(self.layout, self.world, self.seq_len, cu)
            algorithms.get(self.algorithm).check(self.shape, self.world, self.layout, self.causal,
                                                 self.option_dict, cu)
            return
        if not self.cu_seqlens:
            algorithms.check(self.algorithm, self.shape, self.world, self.layout, self.causal,
                             **self.option_dict)
            return
        require(self.cu_seqlens[-1] == self.seq_len, "cu_seqlens", list(self.cu_seqlens),
                f"must end at seq_len={self.seq_len}")
        cls = algorithms.get(self.algorithm)
        layouts.check_layout(self.layout)
        cu = layouts.normal_cu(self.layout, self.world, self.seq_len, self.cu_seqlens)
        cls.check(self.shape, self.world, self.layout, self.causal, self.option_dict, cu)



@dataclass(frozen=True)
class TrainCase:
    """Training steps of the decoder with one attention algorithm over SP ranks, DP replicas."""

    algorithm: str = "ring"
    sp: int = 1                      # sequence-parallel ranks
    dp: int = 1                      # data-parallel replicas (each its own batch)
    layout: str = "zigzag"
    model: str = "tiny"              # a model preset (seqpar.model.MODELS), YAML or config.json
    model_overrides: tuple[tuple[str, int], ...] = ()   # e.g. (("vocab", 4096),)
    seq_len: int = 256
    batch: int = 1                   # per DP replica
    dtype: str = "float32"
    checkpoint: str = "none"
    seq_fraction: float = 0.5
    fused_head: bool = False
    head_tiles: tuple[int, int] = (1024, 8192)
    options: tuple[tuple[str, object], ...] = ()
    warmup: int = 1
    iters: int = 3
    seed: int = 0
    lr: float = 1e-3
    states: str = "replicated"       # replicated | fsdp (FSDP2 over DP x SP) | zero1 | dist-opt
    master_dtype: str | None = None  # fp32 master weights for a bf16 model: "float32"
    offload: tuple[str, ...] | bool = ()  # to host: optimizer, params, activations (CUDA only)
    text: str | None = None          # a UTF-8 text file: byte tokens, documents packed (None: random)
    text_separator: str = "\n\n"     # what separates two documents of the text
    corpus: str | None = None        # a corpus's token ids (seqpar.corpus.cache: KEY.ids, made on
    corpus_vocab: int = 0            # the driver) and its tokenizer's vocabulary (None: no corpus)
    tiled: bool = False              # the MLP over token tiles, recomputed per tile (ALST)
    mask: str = ""                   # any attention mask, its compact form ("": causal)
    # a step of variable-length sequences (docs/lengths.md); "" = batch x seq_len tokens a replica
    lengths: str = ""                # the length distribution's compact form (rules.lengths)
    tokens_per_step: int = 0         # tokens a step trains on, all ranks together
    sp_policy: str = "static"        # static | dynamic (rules.deal)
    packing: str = "best-fit"        # best-fit | cost-balanced (static)
    capacity: int = 0                # tokens per rank a micro-batch may hold
    equal_counts: bool = False       # dynamic: every rank as many micro-batches (FSDP needs it)
    any_size: bool = False           # dynamic: groups of any size (plan.group_sizes: any)
    degrees: str = "smallest"        # dynamic: group sizes, the smallest that holds or by cost
    # algorithm "auto" (dynamic): what each group size runs, chosen on the driver by the planner:
    # (size, algorithm, options as sorted (key, value) pairs)
    algorithms_by_size: tuple[tuple[int, str, tuple[tuple[str, Any], ...]], ...] = ()
    window: int | None = None        # a causal sliding window inside each sequence
    batches: tuple[Batch, ...] = ()  # the replayed batches and their deals, made on the driver

    def config(self) -> ModelConfig:
        """The decoder: a preset, a YAML of ModelConfig's fields or a Hugging Face config.json
        (`ModelConfig.load`), with the overrides."""
        return dataclasses.replace(ModelConfig.load(self.model), **dict(self.model_overrides))

    @property
    def attention_mask(self) -> masks.Mask | None:
        """The mask every layer's attention runs (None: causal, documents from the data)."""
        return masks.parse(self.mask, self.seq_len) if self.mask else None

    # what the trial runner and TrialResult read from any case
    causal: bool = True
    mode: str = "train"

    @property
    def world(self) -> int:
        return self.sp * self.dp

    @property
    def option_dict(self) -> dict[str, object]:
        return dict(self.options)

    @property
    def shape(self) -> AttnShape:
        """One attention layer of the model over the SP group (per DP replica)."""
        c = self.config()
        return AttnShape(self.batch, self.seq_len, c.heads, c.kv_heads, c.head_dim,
                         DTYPES[self.dtype].itemsize)

    def validate(self) -> None:
        """Every rule of this training case, before any actor starts. Raises ConfigError."""
        require(isinstance(self.sp, int) and self.sp >= 1, "sp", self.sp, "must be a positive integer")
        require(isinstance(self.dp, int) and self.dp >= 1, "dp", self.dp, "must be a positive integer")
        _common_rules(self.world, self.dtype, self.warmup, self.iters)
        checkpointing.check_mode(self.checkpoint, self.seq_fraction)
        if self.checkpoint == "seq-attn":  # BurstEngine §3.2: a rank's first F must be a global prefix
            require(not self.lengths, "checkpoint", self.checkpoint,
                    "seq-attn takes one sequence a replica, not workload.lengths")
            relation = self.attention_mask.relation if self.mask else None
            require(not self.mask or relation is not None, "mask", self.mask,
                    "seq-attn splits causal attention, packed documents or a causal window only")
            check_seq_attn(self.algorithm, self.layout, self.seq_fraction, self.sp, self.seq_len,
                           documents=self.text is not None or self.corpus is not None
                           or bool(relation and relation.cu),
                           causal=relation.causal if relation is not None else True)
        require(self.master_dtype is None or self.master_dtype in DTYPES, "master_dtype",
                self.master_dtype, f"must be one of {', '.join(DTYPES)} (or none)")
        self.state_policy().check(DTYPES[self.dtype], None)
        cfg = self.config()
        require(self.text is None or cfg.vocab >= 256, "vocab", cfg.vocab,
                "must be at least 256 to train on text (one token per byte)")
        require(self.text is None or self.batch == 1, "batch", self.batch,
                "must be 1 with text data (a batch row is one window of packed documents; "
                "use train.dp for more rows)")
        require(not self.mask or self.text is None, "mask", self.mask,
                "cannot be given with text data (its packed documents are the relation)")
        if self.mask:
            self.attention_mask  # noqa: B018 (a bad mask: one line, before any rank starts)
        if self.corpus is not None:
            self._check_corpus(cfg)
        require(self.algorithm != pool_rules.AUTO or (bool(self.lengths)
                                                      and self.sp_policy == "dynamic"),
                "algorithm", self.algorithm, "chooses an algorithm per group size of the dynamic "
                "policy: needs workload.lengths and plan.sp_policy dynamic")
        if self.lengths:
            self._check_lengths(cfg)
            return
        require(self.window is None, "window", self.window,
                "a training trial takes a window with workload.lengths only")
        algorithms.check(self.algorithm, self.shape, self.sp, self.layout, True, **self.option_dict)

    def _check_corpus(self, cfg: ModelConfig) -> None:
        """A corpus's token ids as data: every id inside the model's vocabulary; as packed
        documents (no lengths), the rules of text data."""
        require(self.text is None, "text", self.text, "a trial trains on a text or a corpus, not both")
        require(cfg.vocab >= self.corpus_vocab, "vocab", cfg.vocab, "must hold the tokenizer's "
                f"vocabulary ({self.corpus_vocab} ids) to train on its corpus")
        require(bool(self.lengths) or self.batch == 1, "batch", self.batch,
                "must be 1 with corpus data (a batch row is one window of packed documents; "
                "use train.dp for more rows)")
        require(not self.mask, "mask", self.mask,
                "cannot be given with corpus data (its packed documents are the relation)")

    def _check_lengths(self, cfg: ModelConfig) -> None:
        """The rules of a step of variable-length sequences (the batches are dealt already)."""
        require(not self.mask and self.text is None, "lengths", self.lengths,
                "takes no mask and no text data (give a text as lengths: text:PATH)")
        require(bool(self.batches), "batches", len(self.batches),
                "a step of lengths needs its dealt batches (rules.deal.plan_batches)")
        require(self.sp_policy == "static" or self.dp == 1, "dp", self.dp,
                "must be 1 under the dynamic policy (its groups come from the whole pool)")
        require(self.sp_policy == "static" or not self.algorithm.startswith("peer:"),
                "sp_policy", self.sp_policy, "peers take the static policy only")
        require(self.states != "fsdp" or self.sp_policy == "static" or self.equal_counts,
                "states", self.states, "FSDP gathers every layer over the pool on every forward: "
                "under the dynamic policy it needs equal_counts (every rank as many micro-batches; "
                "states: dist-opt gathers once a step and needs none)")
        for b in self.batches:
            require(b.deal.pool == self.world and b.deal.policy == self.sp_policy, "batches",
                    b.deal.policy, f"must be dealt to a pool of {self.world} under {self.sp_policy}")
        for size in self.group_sizes():
            self.options_at(size, cfg)

    def group_sizes(self) -> tuple[int, ...]:
        """The sizes of the groups this trial's deals use."""
        return tuple(sorted({m.size for b in self.batches for m in b.deal.micro}))

    def options_at(self, size: int, cfg: ModelConfig | None = None) -> tuple[str, dict[str, Any]]:
        """(algorithm, options) a group of `size` runs (`rules.pool.options_at`; under `auto`
        the driver's choice for that size)."""
        c = cfg or self.config()
        if self.algorithm == pool_rules.AUTO:
            chosen = {d: (name, dict(opts)) for d, name, opts in self.algorithms_by_size}
            require(size in chosen, "algorithm", self.algorithm, f"no algorithm was chosen for a "
                    f"group of {size} ranks (the driver chooses one per size of the deal)")
            name, options = chosen[size]
            return pool_rules.options_at(name, size, options, c.heads, c.kv_heads, c.head_dim)
        return pool_rules.options_at(self.algorithm, size, self.option_dict, c.heads, c.kv_heads,
                                     c.head_dim)

    def policy(self) -> TrainPolicy:
        """What decides this step's memory besides the shapes (the planner's unit)."""
        return TrainPolicy(states=self.states, master_dtype=self.master_dtype, offload=self.offload,
                           checkpoint=self.checkpoint, seq_fraction=self.seq_fraction,
                           fused_head=self.fused_head, tiled=self.tiled)

    def state_policy(self) -> StatePolicy:
        """Where the model states live (the runner and the planner read the same policy)."""
        master = None if self.master_dtype is None else DTYPES[self.master_dtype]
        return StatePolicy(self.states, master, self.offload)


    def label(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options)
        dp = f" DP={self.dp}" if self.dp > 1 else ""
        head = " fused-head" if self.fused_head else ""
        head += "" if self.states == "replicated" else f" {self.states}" + (
            "".join(f"+offload:{o}" for o in self.state_policy().offload))
        head += " tiled" if self.tiled else ""
        head += f" mask={self.mask[:32]}" if self.mask else ""
        head += f" master={self.master_dtype}" if self.master_dtype else ""
        if self.lengths:
            head += f" {self.sp_policy}" + (f"/{self.packing}" if self.sp_policy == "static"
                                             else " any-size" if self.any_size else "")
            head += " degrees=cost" if self.degrees == "cost" else ""
            head += "".join(f" {d}:{name}" for d, name, _ in self.algorithms_by_size)
            head += f" {self.lengths} T={self.tokens_per_step}"
        ckpt = self.checkpoint + (f"({self.seq_fraction})" if uses_fraction(self.checkpoint) else "")
        model = self.model + "".join(f" {k}={v}" for k, v in self.model_overrides)
        return (f"train {model} {self.algorithm}{opts} SP={self.sp}{dp} {self.layout} "
                f"N={self.seq_len} ckpt={ckpt}{head} {self.dtype}")


GANG_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")     # it names Ray actors: seqpar:<gang>:rank-<r>
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Trial:
    """One trial: the case, where it runs and in which gang. Validated when it is made (a
    ConfigError before any actor starts); afterwards nothing checks it again.

        trial = Trial(Case("ring", world=4), gang_id="mine", nodes=2,
                      links={"inter": LinkModel(1e-3, 1e9)})

    `links` and `env_vars` may be given as mappings; they are kept as sorted pairs (frozen, one
    form). `ranks_per_node` defaults to world / nodes. Trials with equal `gang_id` (and world,
    device and variables) share a gang of rank actors: start-up is the expensive part."""

    case: Case | TrainCase
    gang_id: str
    nodes: int = 1
    ranks_per_node: int | None = None
    links: tuple[tuple[str, LinkModel], ...] = ()   # link class -> its emulated model
    timeout_s: float = 300.0                         # rendezvous to the last rank's result
    env_vars: tuple[tuple[str, str], ...] = ()       # every rank starts with these

    def __post_init__(self) -> None:
        for name in ("links", "env_vars"):
            value = getattr(self, name)
            pairs = value.items() if isinstance(value, Mapping) else (value or ())
            object.__setattr__(self, name, tuple(sorted(pairs)))
        require(isinstance(self.case, Case | TrainCase), "case", type(self.case).__name__,
                "must be a seqpar Case or TrainCase")
        self.case.validate()
        object.__setattr__(self, "ranks_per_node",
                           ranks_per_node_of(self.case.world, self.nodes, self.ranks_per_node))
        require(isinstance(self.gang_id, str) and GANG_ID.fullmatch(self.gang_id) is not None,
                "gang_id", self.gang_id, "must be letters, digits, '_', '.' or '-'")
        for link, model in self.links:
            require(link in ("intra", "inter"), "link_emulation", link,
                    "keys are 'intra' and 'inter'")
            require(isinstance(model, LinkModel), f"link_emulation[{link}]", model,
                    "must be a LinkModel(latency_s, bandwidth_bytes_per_s)")
            require(model.latency_s >= 0, f"link_emulation[{link}].latency_s", model.latency_s,
                    "must be >= 0")
            require(model.bandwidth_bytes_per_s > 0,
                    f"link_emulation[{link}].bandwidth_bytes_per_s", model.bandwidth_bytes_per_s,
                    "must be > 0")
        require(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0")
        for key, value in self.env_vars:
            require(ENV_NAME.fullmatch(key) is not None and isinstance(value, str), "env_vars", key,
                    "must name an environment variable (letters, digits, '_') with a string value")

    @property
    def world(self) -> int:
        return self.case.world

    @property
    def link_models(self) -> dict[str, LinkModel] | None:
        """The emulated link classes (None: none), as the ranks' Comms take them."""
        return dict(self.links) or None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.env_vars)

    def in_gang(self, gang_id: str) -> Trial:
        """The same (already validated) trial in another gang."""
        require(isinstance(gang_id, str) and GANG_ID.fullmatch(gang_id) is not None, "gang_id",
                gang_id, "must be letters, digits, '_', '.' or '-'")
        new = object.__new__(Trial)  # not dataclasses.replace: it would validate again
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, getattr(self, f.name))
        object.__setattr__(new, "gang_id", gang_id)
        return new
