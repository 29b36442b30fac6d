#!/usr/bin/env python3
"""Writes tests/fixtures/beam_search.json: Hugging Face transformers' beam
search on the tiny fixture models, the reference for mllm-rs's beam search.

    python3 -m venv /tmp/beam-env
    /tmp/beam-env/bin/pip install torch==2.15.0 transformers==5.23.0 safetensors numpy
    /tmp/beam-env/bin/python scripts/make_beam_references.py

Each case runs `generate(num_beams=..., do_sample=False, ...)` on one prompt
(batch size 1, no padding) and records, for every returned sequence, the
generated ids (the returned length comes from `beam_indices`, as
transformers itself crops) and `sequences_scores`, and the number of steps
the search ran (one score tensor per step). One case per model uses
end-of-sequence ids that greedy decoding produces early ("greedy": its
third token; "greedy2": its second and third), so that hypotheses end
inside the token budget and the search stops before it (transformers'
early-stopping heuristic).
"""

import json
import pathlib

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MODELS = ["tiny-llama", "tiny-qwen2", "tiny-gpt2"]
PROMPTS = {
    "short": [1, 17, 200, 33, 5, 99, 42, 7, 128, 64, 250, 3],
    "long9": [121, 131, 193, 243, 8, 36, 210, 242, 63],
}
# (prompt, num_beams, length_penalty, early_stopping, num_return_sequences, max_new_tokens, eos)
CASES = [
    ("short", 2, 1.0, False, 2, 12, None),
    ("long9", 4, 1.0, False, 3, 10, None),
    ("short", 3, 0.5, True, 3, 10, None),
    ("long9", 3, 2.0, "never", 2, 10, None),
    ("short", 4, 1.0, False, 4, 12, "greedy"),
    ("long9", 2, 0.0, True, 2, 12, "greedy"),
    ("short", 3, 1.0, False, 3, 16, "greedy2"),
    ("long9", 3, -1.0, False, 3, 16, "greedy2"),
]


def greedy_ids(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def beam_case(model, prompt, beams, lp, early, n_ret, max_new, eos):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        do_sample=False,
        num_beams=beams,
        length_penalty=lp,
        early_stopping=early,
        num_return_sequences=n_ret,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
    )
    results = []
    steps = len(out.scores)
    for seq, score, idx in zip(out.sequences, out.sequences_scores, out.beam_indices):
        n = int((idx != -1).sum())
        results.append({"ids": seq[len(prompt):len(prompt) + n].tolist(), "score": float(score)})
    return results, steps


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cases = []
    for name in MODELS:
        model = AutoModelForCausalLM.from_pretrained(FIXTURES / name, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        model.generation_config.eos_token_id = None
        for prompt_name, beams, lp, early, n_ret, max_new, eos in CASES:
            prompt = PROMPTS[prompt_name]
            eos_ids = []
            if eos == "greedy":
                eos_ids = greedy_ids(model, prompt, 3)[2:3]
            elif eos == "greedy2":
                eos_ids = greedy_ids(model, prompt, 3)[1:3]
            with torch.no_grad():
                results, steps = beam_case(model, prompt, beams, lp, early, n_ret, max_new, eos_ids or None)
            cases.append({
                "model": name,
                "prompt": prompt,
                "num_beams": beams,
                "length_penalty": lp,
                "early_stopping": early if isinstance(early, str) else bool(early),
                "num_return_sequences": n_ret,
                "max_new_tokens": max_new,
                "eos_ids": eos_ids,
                "steps": steps,
                "results": results,
            })
            ends = [len(r["ids"]) for r in results]
            print(f"{name} {prompt_name} beams={beams} lp={lp} early={early} eos={eos_ids}: lengths {ends}, {steps} steps")
    doc = {
        "about": "transformers beam search on the tiny fixtures; made by scripts/make_beam_references.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": cases,
    }
    path = FIXTURES / "beam_search.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
