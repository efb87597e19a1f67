"""Measuring: the measured-choice record every kernel decision shares, the int4 row plan, and the timing of a target's passes."""
