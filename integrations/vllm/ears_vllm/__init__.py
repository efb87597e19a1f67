"""EARS Studio's acceptance rules inside vLLM, as a plug-in (entry point ``vllm.general_plugins``).

    EARS_VLLM_RULE=ears EARS_VLLM_BETA=0.1 python -m vllm.entrypoints.openai.api_server ...

EARS_VLLM_RULE: ``standard``, ``ears`` or ``ears-entropy`` (unset: vLLM's acceptance unchanged).
EARS_VLLM_BETA: the tolerance scale, >= 0 (default 0.1). See README.md beside this package.
"""

from .counters import read_counters
from .plugin import ConfigError, config_from_env, configure, current_rule, expand_kernel_impl, register
from .rules import RULES, RuleConfig, shifted_uniforms, tolerance

__all__ = ["register", "configure", "current_rule", "read_counters", "config_from_env", "ConfigError",
           "expand_kernel_impl", "RULES", "RuleConfig", "tolerance", "shifted_uniforms"]
__version__ = "0.1.0"
