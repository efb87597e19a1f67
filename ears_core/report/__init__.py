"""Reporting: plotly figures (never gradio) and the benchmark's plan and report."""
