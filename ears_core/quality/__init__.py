"""The task score: do the answers get worse, and by how much, at each rule and knob.

questions.py  the question set (assets/quality/questions.json): categories, prompts, which are kept
score.py      normalising a reply and reading the first answer in it
runs.py       settings (target-only or a rule with its parameters) run on questions and seeds, interleaved
summary.py    accuracy with a bootstrap interval over questions, speedup, acceptance, distortion
section.py    the bench's ``quality`` section: its settings, the sweep and its summary
"""
