#!/usr/bin/env python3
"""Where CUDA and the CPU chose different greedy tokens (gpu-session.sh's gpu-vs-cpu-diff.log),
print the CPU's log-probabilities of both choices at the first differing token of each prompt,
as a markdown row: a gap of a few thousandths of a nat is a near-tie, not a bug.
  usage: scripts/near-ties.py DIFF_LOG... [--kvrun build-srv/kvrun] [--shared ../shared]"""
import argparse
import json
import subprocess


def entries(path):
    """(model, kv, cpu token lists, cuda token lists) per '== MODEL KV' record."""
    lines = open(path).read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("== "):
            _, model, kv = lines[i].split()
            rows = [json.loads("{" + l.split(":", 1)[1].strip() + "}")["tokens"]
                    if l.startswith(("cpu:", "cuda:")) else
                    json.loads("{" + l + "}")["tokens"] for l in lines[i + 1:i + 9]]
            yield model, kv, rows[:4], rows[4:]
            i += 9
        else:
            i += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--kvrun", default="build-srv/kvrun")
    ap.add_argument("--shared", default="../shared")
    a = ap.parse_args()
    prompts = [l.rstrip("\n") for l in open(f"{a.shared}/reference/prompts.txt")]
    print("| model | KV | prompt | token | CPU's choice (log-prob) | CUDA's choice (CPU log-prob) | gap |")
    print("|---|---|---:|---:|---|---|---:|")
    seen = set()
    for log in a.logs:
        for model, kv, cpu, cuda in entries(log):
            if (model, kv) in seen:
                continue
            seen.add((model, kv))
            for p, (x, y) in enumerate(zip(cpu, cuda)):
                if x == y:
                    continue
                k = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), None)
                if k is None:  # one stopped early (end of text): not a token choice
                    print(f"| {model} | {kv} | {p + 1} | {min(len(x), len(y)) + 1} | length differs | | |")
                    continue
                req = {"prompt": prompts[p].replace("\\n", "\n"), "n_predict": k + 1,
                       "temperature": 0, "n_probs": 10}
                out = subprocess.run([a.kvrun, "run", "-m", f"{a.shared}/models/{model}", "--jsonl",
                                      "--kv-type", kv, "--device", "cpu"],
                                     input=json.dumps(req), capture_output=True, text=True,
                                     check=True).stdout
                top = {t["id"]: t["logprob"]
                       for t in json.loads(out.splitlines()[0])["logprobs"][k]["top_logprobs"]}
                lx, ly = top.get(x[k]), top.get(y[k])
                gap = f"{abs(lx - ly):.5f}" if lx is not None and ly is not None else "> top 10"
                fmt = lambda v: f"{v:.5f}" if v is not None else "not in top 10"
                print(f"| {model} | {kv} | {p + 1} | {k + 1} | {x[k]} ({fmt(lx)}) | "
                      f"{y[k]} ({fmt(ly)}) | {gap} |")


if __name__ == "__main__":
    main()
