"""Speculative sampling for temporal point processes (seed 001, second half; TPP-SD's draft model, made exact).

processes    known point processes: Hawkes (one or several marks), self-correcting, renewal; exact
             log-likelihoods and compensators
transformer  the transformer TPP (THP-style temporal encoding, windowed causal attention, KV cache)
model        the log-normal mixture x categorical law ``EventDist``; the GRU TPP of the first implementation
events       committed events of B rows, how each was decided, run records
verify       the draft-model rule over the joint time-and-mark density: ratio, residual, bonus
samplers     autoregressive, draft-model (TPP-SD) and self-proposal (seed 001) samplers for the transformer
constants    rejection constants M >= sup target / proposal (the self-proposal sampler)
cost         measured round prices, acceptance, the draft length of each round and the fallback
run          ``sample`` and ``stream``: one entry point for the three samplers
sampler      the GRU model's Algorithm 1 sampler (seed 001's first implementation)
figures, viz plotly figures (no gradio): the transformer samplers', and the GRU sampler's
"""

from .constants import RejectionConstant, envelope_constant, rejection_constant, with_heavy_tail
from .model import EventDist, NeuralTPP, TPPConfig, load_model
from .processes import PROCESSES, HawkesProcess, RenewalProcess, SelfCorrectingProcess, Sequence, make_process
from .run import METHODS, sample, stream
from .sampler import SampleResult, SpecConfig, TPPStep, autoregressive_sample, speculative_sample
from .transformer import TransformerConfig, TransformerTPP, load_pair, load_transformer

__all__ = ["RejectionConstant", "envelope_constant", "rejection_constant", "with_heavy_tail", "EventDist",
           "NeuralTPP", "TPPConfig", "load_model", "PROCESSES", "HawkesProcess", "RenewalProcess",
           "SelfCorrectingProcess", "Sequence", "make_process", "METHODS", "sample", "stream", "SampleResult",
           "SpecConfig", "TPPStep", "autoregressive_sample", "speculative_sample", "TransformerConfig",
           "TransformerTPP", "load_pair", "load_transformer"]
