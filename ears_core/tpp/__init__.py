"""Speculative sampling for temporal point processes (seed 001, second half; TPP-SD's draft model, made exact).

processes    known point processes: Hawkes (one or several marks), self-correcting, renewal; exact
             log-likelihoods and compensators
event_law    the next event's law ``EventDist`` (log-normal mixture in time x categorical mark) and the
             checks on a given history
transformer  the transformer TPP (THP-style temporal encoding, windowed causal attention, KV cache)
events       committed events of B rows, how each was decided, run records
verify       the draft-model rule over the joint time-and-mark density: ratio, residual, bonus
samplers     autoregressive, draft-model (TPP-SD) and self-proposal (seed 001) samplers for the transformer
constants    rejection constants M >= sup target / proposal (the self-proposal sampler)
cost         measured round prices, acceptance, the draft length of each round and the fallback
run          ``sample`` and ``stream``: one entry point for the three samplers
figures      plotly figures of a run (no gradio): timeline, acceptance per round, QQ
"""

from .constants import RejectionConstant, envelope_constant, rejection_constant, with_heavy_tail
from .event_law import EventDist, check_history
from .processes import PROCESSES, HawkesProcess, RenewalProcess, SelfCorrectingProcess, Sequence, make_process
from .run import METHODS, sample, stream
from .transformer import TransformerConfig, TransformerTPP, load_pair, load_transformer

__all__ = ["RejectionConstant", "envelope_constant", "rejection_constant", "with_heavy_tail", "EventDist",
           "check_history", "PROCESSES", "HawkesProcess", "RenewalProcess", "SelfCorrectingProcess", "Sequence",
           "make_process", "METHODS", "sample", "stream", "TransformerConfig", "TransformerTPP", "load_pair",
           "load_transformer"]
