"""Measuring: the measured-choice record every kernel decision shares and how a cached record is read back, the int4 row plan, and the timing of a target's passes."""
