"""`TrainCase`: training steps of the decoder with one attention algorithm over SP ranks and DP
replicas (mode train): the model, its states and checkpointing, the data (random, a text, a
corpus), a step of variable-length sequences dealt to the pool's groups, and every rule it keeps
(`validate`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from seqpar import algorithms
from seqpar.algorithms.base import DTYPES, AttnShape
from seqpar.case.common import common_rules
from seqpar.errors import require
from seqpar.model import checkpointing, ep
from seqpar.model.config import ModelConfig
from seqpar.model.memory import TrainPolicy
from seqpar.model.states import StatePolicy
from seqpar.rules import masks
from seqpar.rules import pool as pool_rules
from seqpar.rules.algorithms import check_mla_pass
from seqpar.rules.deal import Batch
from seqpar.rules.linear import check_lasp
from seqpar.rules.memory import check_seq_attn, uses_fraction


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
    mla_pass: str = "kv"             # an MLA model's ring carries K,V or the latent (MLA_PASSES)
    linear_sp: str | None = None     # a hybrid's linear layers: lasp2 | lasp1 (None: lasp2)
    ep: int = 1                      # expert parallelism: ranks an MoE layer's experts spread over
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
        return AttnShape.of_model(self.config(), self.batch, self.seq_len,
                                  DTYPES[self.dtype].itemsize)

    def validate(self) -> None:
        """Every rule of this training case, before any actor starts. Raises ConfigError."""
        require(isinstance(self.sp, int) and self.sp >= 1, "sp", self.sp, "must be a positive integer")
        require(isinstance(self.dp, int) and self.dp >= 1, "dp", self.dp, "must be a positive integer")
        common_rules(self.world, self.dtype, self.warmup, self.iters)
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
        check_mla_pass(self.mla_pass, cfg.mla, self.algorithm, self.checkpoint)
        check_lasp(cfg, self.layout, self.sp, self.linear_sp)
        # EP groups: `ep` consecutive ranks of the DP x SP world (rules.groups, model.ep)
        ep.check(self.ep, cfg, self.world, self.states, self.state_policy().offload, self.tiled,
                 self.checkpoint)
        require(self.ep == 1 or not self.lengths or self.sp_policy == "static" or
                self.equal_counts, "ep", self.ep, "with workload.lengths needs every rank to "
                "run as many micro-batches: the static policy, or equal_counts")
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
        dp = (f" DP={self.dp}" if self.dp > 1 else "") + (f" EP={self.ep}" if self.ep > 1 else "")
        head = " fused-head" if self.fused_head else ""
        head += "" if self.states == "replicated" else f" {self.states}" + (
            "".join(f"+offload:{o}" for o in self.state_policy().offload))
        head += " tiled" if self.tiled else ""
        head += f" mask={self.mask[:32]}" if self.mask else ""
        head += f" master={self.master_dtype}" if self.master_dtype else ""
        head += f" mla_pass={self.mla_pass}" if self.mla_pass != "kv" else ""
        head += f" {self.linear_sp}" if self.linear_sp else ""
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
