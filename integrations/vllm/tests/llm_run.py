"""Run vllm.LLM once in a fresh process (vLLM's default multi-process engine, the plug-in loaded
through its entry point) and write what came out as JSON. The tests start it as a subprocess:

    python llm_run.py '<json: model, engine, prompts, temperature, max_tokens, seed>' OUT.json
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams

    import ears_vllm

    llm = LLM(model=cfg["model"], **cfg["engine"])
    params = [SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], seed=cfg["seed"] + i)
              for i in range(len(cfg["prompts"]))]
    outs = llm.generate(cfg["prompts"], params, use_tqdm=False)
    result = {"token_ids": [list(o.outputs[0].token_ids) for o in outs], "texts": [o.outputs[0].text for o in outs],
              "counters": ears_vllm.read_counters()}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":  # vLLM starts its engine with spawn: the guard is required
    main()
