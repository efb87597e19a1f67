"""Speculative sampling for temporal point processes (seed 001, second half).

processes  known point processes to learn from (Hawkes by thinning, renewal)
model      the neural TPP: GRU encoder, log-normal mixture x categorical decoder, exact likelihood
constants  rejection constants M >= sup target / proposal for pairs of torch.distributions
sampler    the exact speculative event sampler and the autoregressive baseline
viz        plotly figures (no gradio)
"""

from .constants import RejectionConstant, envelope_constant, rejection_constant, with_heavy_tail
from .model import EventDist, NeuralTPP, TPPConfig, load_model
from .processes import HawkesProcess, RenewalProcess, Sequence
from .sampler import SampleResult, SpecConfig, TPPStep, autoregressive_sample, speculative_sample

__all__ = ["RejectionConstant", "envelope_constant", "rejection_constant", "with_heavy_tail", "EventDist",
           "NeuralTPP", "TPPConfig", "load_model", "HawkesProcess", "RenewalProcess", "Sequence", "SampleResult",
           "SpecConfig", "TPPStep", "autoregressive_sample", "speculative_sample"]
