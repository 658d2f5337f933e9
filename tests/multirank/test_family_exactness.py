"""Every family's decoder is exact under sequence parallelism (issue 42): a tiny config.json of the
family, read as a user's is (`rules.from_hf`), trained by an SP algorithm on P ranks equals the
one-process model in float64 — the loss and every gradient, on every rank — and every rank's bytes
equal the analytic count summed over the layers (a sliding layer's window skips the transfers no
query of its window needs), in a fixed-length step and in steps of variable-length sequences under
the static and the dynamic SP policy (the runner's own `model.step.train_step`).

`make test` runs one representative of each scenario per family (the algorithm, P and layout
rotating over the families); test_family_exactness_full.py is the matrix (`make test-full`): every
family x algorithm x P in {2, 3, 4} x layout, fixed-length, and every family x algorithm x P x
policy, the layout rotating. A family whose fields the torch decoder does not compute yet is
skipped with the field it refuses.
"""

from __future__ import annotations

import json

import pytest

from seqpar.errors import ConfigError
from seqpar.experiments.steps import make_case
from seqpar.model import ModelConfig, Transformer
from seqpar.rules.model import from_hf
from seqpar.workers import step_check
from seqpar.workers.measure import check_model
from tests.resources import FULL

ALGORITHMS = ("allgather", "ulysses", "ring", "usp", "double_ring", "wallfacer", "burst")
LAYOUTS = ("contiguous", "zigzag", "stripe", "balanced")
WORLDS = (2, 3, 4)
POLICIES = ("static", "dynamic")
NOT_YET = "is not computed by seqpar's torch decoder yet"

# the families' tiny config.json (12 heads: Ulysses splits them at P = 2, 3 and 4; a window of 5
# tokens: shorter than a rank's shard, so a sliding layer's ring skips transfers)
_COMMON = {"vocab_size": 61, "hidden_size": 96, "num_hidden_layers": 2, "intermediate_size": 32,
           "num_attention_heads": 12, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILIES: dict[str, dict] = {
    "llama": {**_COMMON, "model_type": "llama"},
    "llama3.1": {**_COMMON, "model_type": "llama", "num_key_value_heads": 12,
                 "rope_theta": 500000.0,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}},
    "qwen2": {**_COMMON, "model_type": "qwen2", "rope_theta": 1000000.0},
    "qwen3": {**_COMMON, "model_type": "qwen3", "hidden_size": 48, "head_dim": 8,
              "num_key_value_heads": 6, "rope_theta": 1000000.0},
    "smollm3": {**_COMMON, "model_type": "smollm3", "num_hidden_layers": 4,
                "no_rope_layers": [1, 1, 1, 0], "tie_word_embeddings": True},
    "mistral": {**_COMMON, "model_type": "mistral", "sliding_window": 5},
    "gemma3": {**_COMMON, "model_type": "gemma3_text", "hidden_size": 48, "head_dim": 8,
               "num_hidden_layers": 3, "sliding_window": 5, "rope_theta": 1000000.0,
               "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 8,
               "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
               "tie_word_embeddings": True},
    "gpt-oss": {**_COMMON, "model_type": "gpt_oss", "hidden_size": 48, "head_dim": 8,
                "sliding_window": 5, "num_local_experts": 4, "num_experts_per_tok": 2,
                "swiglu_limit": 7.0, "rope_theta": 150000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "original_max_position_embeddings": 16,
                                 "truncate": False}},
    "mixtral": {**_COMMON, "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "mixtral-aux": {**_COMMON, "model_type": "mixtral", "num_local_experts": 4,
                    "num_experts_per_tok": 2, "output_router_logits": True,
                    "router_aux_loss_coef": 0.02},  # the load-balancing loss over the sequence
    "qwen3-moe": {**_COMMON, **_MOE, "model_type": "qwen3_moe", "hidden_size": 48,
                  "head_dim": 8, "num_hidden_layers": 3, "num_experts": 4,
                  "mlp_only_layers": [0], "norm_topk_prob": True},
    "deepseek-v3": {**_COMMON, **_MOE, "model_type": "deepseek_v3", "hidden_size": 48,
                    "num_key_value_heads": 12, "first_k_dense_replace": 1, "q_lora_rank": 12,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
                    "v_head_dim": 6, "n_routed_experts": 4, "n_group": 2, "topk_group": 1,
                    "n_shared_experts": 1},  # latent attention, V its own width, grouped router
    "qwen3-next": {**_COMMON, **_MOE, "model_type": "qwen3_next", "hidden_size": 48,
                   "head_dim": 8, "num_key_value_heads": 6, "partial_rotary_factor": 0.5,
                   "layer_types": ["linear_attention", "full_attention"],
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                   "linear_conv_kernel_dim": 4, "num_experts": 4,
                   "shared_expert_intermediate_size": 16},  # a DeltaNet layer under LASP-2
}


def family(name: str) -> ModelConfig:
    """The family's tiny model as `seqpar` reads its config.json; skipped while the torch decoder
    refuses one of its fields."""
    cfg = from_hf(json.loads(json.dumps(FAMILIES[name])), f"{name} config.json")
    try:
        Transformer(cfg)
    except ConfigError as err:
        if NOT_YET in str(err):
            pytest.skip(f"{name}: {err}")
        raise
    return cfg


def options_for(algorithm: str, world: int) -> dict:
    """Each algorithm in a form that does its non-trivial thing at this P."""
    if algorithm == "usp":
        return {"dhp": 2} if world % 2 == 0 else {"dhp": world}
    if world != 4:
        return {}
    return {"double_ring": {"inner_ring": 2}, "wallfacer": {"team_size": 2},
            "burst": {"ranks_per_node": 2}}.get(algorithm, {})


def layouts_of(cfg: ModelConfig) -> tuple[str, ...]:
    """The layouts the model takes: all but balanced where its layers' windows differ (balanced
    deals the tokens by one relation; the model refuses it in one line)."""
    out = []
    for layout in LAYOUTS:
        try:
            check_model.model_rules(cfg, layout)
        except ConfigError as err:
            assert layout == "balanced" and "different windows" in str(err), err
            continue
        if "linear" in cfg.layer_types and layout != "contiguous":
            continue  # LASP passes one state a rank: contiguous shards only (refused in a line)
        out.append(layout)
    return tuple(out)


def fixed_cases(name: str, cfg: ModelConfig, algorithm: str, world: int,
                layouts: tuple[str, ...], seed: int) -> list[check_model.ModelCase]:
    return [check_model.ModelCase(cfg, algorithm, world, layout,
                                  tuple(sorted(options_for(algorithm, world).items())),
                                  seed=seed, name=name) for layout in layouts]


def check_fixed(gang, cases: list[check_model.ModelCase]) -> None:
    """The cases (one algorithm, options and world) in one gang call; each against the
    one-process model and the analytic bytes."""
    for case in cases:
        case.validate()
    for got in check_model.run_cases(gang, cases):
        assert got.ok, f"{got.case.label()}: {got.failures}"


STEP_OPTIONS = {"usp": {"dhp": 2}, "double_ring": {"inner_ring": 2},
                "wallfacer": {"team_size": 2}}  # at each group size, as the pool's rules allow
CAPACITY = 6  # tokens a rank: sequences up to 6 x P need groups of every size


def step_case(cfg: ModelConfig, algorithm: str, world: int, policy: str, layout: str, seed: int):
    """A step of variable-length sequences (up to 6 x P tokens, so the dynamic policy deals
    groups of more than one size) of the family's model, dealt as a trial's."""
    case = make_case(algorithm, world, f"lognormal:mean=9,sigma=1.0,min=2,max={CAPACITY * world}",
                     tokens=20 * world, capacity=CAPACITY, policy=policy, seed=seed % 1000,
                     layout=layout, options=STEP_OPTIONS.get(algorithm),
                     overrides=check_model.overrides_of(cfg, ModelConfig.load("tiny")),
                     longest=CAPACITY * world)
    assert case.config() == cfg
    check_model.validate_step(case)
    return case


def no_aux_loss(name: str, cfg: ModelConfig) -> None:
    """A step of lengths refuses a load-balancing loss (it would depend on the packing): skipped,
    the refusal itself held to one line on the driver."""
    if cfg.aux_loss_coef:
        with pytest.raises(ConfigError, match="aux_loss_coef.*step of lengths"):
            check_model.step_rules(cfg, "zigzag")
        pytest.skip(f"{name}: a step of lengths refuses aux_loss_coef (fixed length only)")


def check_step(gang, case) -> None:
    got = check_model.evaluate_step(case, gang.run(check_model.rank_step, case),
                                    step_check.reference(case))
    assert got.ok, f"{case.label()}: {got.failures}"


@pytest.mark.multirank
@pytest.mark.parametrize("name", FAMILIES)
def test_a_familys_fixed_length_step_matches_one_process(gang, name, seed):
    """One algorithm and layout a family (make test-full: a second of each), the algorithm, P and
    layout rotating over the families (every algorithm, P and layout met)."""
    i = list(FAMILIES).index(name)
    cfg, world = family(name), WORLDS[i % 3]
    layouts = layouts_of(cfg)
    check_fixed(gang, fixed_cases(name, cfg, ALGORITHMS[i % 7], world,
                                  (layouts[i % len(layouts)],), seed))
    if FULL:
        check_fixed(gang, fixed_cases(name, cfg, ALGORITHMS[(i + 3) % 7], world,
                                      (layouts[(i + 2) % len(layouts)],), seed))


# make test's steps of lengths: each family kind (windows, sinks, MoE, MLA, linear layers) once,
# five algorithms among them (test_dynamic_step.py runs every algorithm under each policy on the
# dense decoder); the other families' steps, the plain dense ones included, are make test-full's
LENGTHS_IN_MAKE_TEST = ("gemma3", "gpt-oss", "qwen3-moe", "deepseek-v3", "qwen3-next")


@pytest.mark.multirank
@pytest.mark.parametrize("name", [n if n in LENGTHS_IN_MAKE_TEST else
                                  pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES])
def test_a_familys_step_of_lengths_matches_one_process(gang, name, seed):
    """One step of variable-length sequences a family: static and dynamic alternating, the
    algorithm, P and layout rotating."""
    i = list(FAMILIES).index(name)
    cfg = family(name)
    no_aux_loss(name, cfg)
    layouts = layouts_of(cfg)
    case = step_case(cfg, ALGORITHMS[(i + 1) % 7], WORLDS[(i + 1) % 3], POLICIES[i % 2],
                     layouts[(i + 1) % len(layouts)], seed)
    check_step(gang, case)


def test_a_window_layer_skips_transfers_in_the_analytic_count():
    """The count the ledger is held to is a window's where a layer slides: less, over the ranks,
    than the same model's with every layer full (ring, P = 4, 24 tokens, window 5)."""
    cfg = from_hf(FAMILIES["mistral"])
    full = from_hf({**FAMILIES["mistral"], "sliding_window": None})
    shape = check_model.ModelCase(cfg, "ring", 4).shape
    for layout in ("contiguous", "zigzag"):
        sliding, causal = ([check_model.layer_bytes(c, "ring", 4, {}, shape, layout, r)
                            for r in range(4)] for c in (cfg, full))
        for phase in ("forward", "backward"):
            assert sum(b[phase] for b in sliding) < sum(b[phase] for b in causal), layout
