"""Write the Hugging Face `datasets` cache entries the cookbook recipes load, from local files.

Run by ``scripts/tinker_client_env.sh`` with the client venv's Python and ``HF_HOME`` set.

With the Hub unreachable (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``),
``datasets.load_dataset("openai/gsm8k", "main")`` falls back to the newest cached copy:
``CachedDatasetModuleFactory`` + the ``cache`` builder read
``$HF_HOME/datasets/openai___gsm8k/main/0.0.0/<hash>/`` (``dataset_info.json`` and
``gsm8k-{train,test}.arrow``). That is the folder a first online ``load_dataset`` call
would have left; this script writes it with the ``json`` builder from rlvr's copy of
GSM8K (``data/gsm8k/{train,test}.jsonl``: the same 7473 + 1319 rows and the same two
string columns, ``question`` and ``answer`` ending in ``#### N``). The ``<hash>`` folder
is named ``rlvr-local-<sha256 of the two files>`` so the log line datasets prints
("Found the latest cached dataset configuration 'main' at ...") says where it came from.

``HuggingFaceH4/no_robots`` (``sl_loop.py``) is not on this machine in any form. With
``--no-robots-substitute`` a clearly labelled SUBSTITUTE is written under that name:
GSM8K question/answer pairs as two-message chats, in no_robots' schema (``prompt``,
``prompt_id``, ``messages`` [{role, content}], ``category``), ``category`` =
``"gsm8k-substitute"``, its description saying what it is, and its cache folder named
``SUBSTITUTE-gsm8k-...`` so every run's log shows it. It is not No Robots data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path


def _sha(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _cache_entry(cache: Path, repo_id: str, config: str, hash_name: str) -> Path:
    """``cache/<org>___<name>/<config>/0.0.0/<hash_name>``: where the ``cache`` builder looks for a dataset."""
    org, name = repo_id.split("/")
    return cache / f"{org}___{name}" / config / "0.0.0" / hash_name


def _install(built: Path, cache: Path, repo_id: str, config: str, hash_name: str, description: str) -> Path:
    """Move a prepared builder folder into the layout the ``cache`` builder reads."""
    target = _cache_entry(cache, repo_id, config, hash_name)
    target_root = target.parents[2]  # <org>___<name>
    info_path = built / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["description"] = description
    info["config_name"] = config
    info_path.write_text(json.dumps(info))
    if target_root.exists():  # one entry per dataset: an older hash would be "the latest" by mtime only
        shutil.rmtree(target_root)
    target.parent.mkdir(parents=True)
    shutil.copytree(built, target)
    return target


def _build(builder_cls, tmp: Path, dataset_name: str, config: str, data_files: dict, features) -> Path:
    b = builder_cls(
        cache_dir=str(tmp),
        dataset_name=dataset_name,
        config_name=config,
        data_files=data_files,
        features=features,
        hash="build",
    )
    b.download_and_prepare()
    return Path(b.cache_dir)


def _write_substitute_split(src: Path, out: Path, split: str) -> None:
    """GSM8K rows of ``src`` as no_robots-schema chats (the labelled SUBSTITUTE), one JSON line each, to ``out``."""
    with open(src) as f, open(out, "w") as g:
        for i, line in enumerate(f):
            row = json.loads(line)
            g.write(
                json.dumps(
                    {
                        "prompt": row["question"],
                        "prompt_id": f"gsm8k-{split}-{i}",
                        "messages": [
                            {"content": row["question"], "role": "user"},
                            {"content": row["answer"], "role": "assistant"},
                        ],
                        "category": "gsm8k-substitute",
                    }
                )
                + "\n"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gsm8k-dir", required=True, type=Path, help="folder with train.jsonl and test.jsonl")
    ap.add_argument("--no-robots-substitute", action="store_true", help="also write the labelled no_robots SUBSTITUTE")
    args = ap.parse_args()

    import datasets
    from datasets.packaged_modules.json.json import Json

    datasets.disable_progress_bars()
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    src = [args.gsm8k_dir / "train.jsonl", args.gsm8k_dir / "test.jsonl"]
    for p in src:
        if not p.is_file():
            print(f"build_offline_datasets: {p} is missing", file=sys.stderr)
            return 1
    sha = _sha(src)

    gsm8k_hash = f"rlvr-local-{sha}"
    if (_cache_entry(cache, "openai/gsm8k", "main", gsm8k_hash) / "dataset_info.json").is_file():
        print(f"openai/gsm8k (main): up to date in {cache}")
    else:
        feats = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
        with tempfile.TemporaryDirectory() as tmp:
            built = _build(
                Json, Path(tmp), "gsm8k", "main", {"train": str(src[0].resolve()), "test": str(src[1].resolve())}, feats
            )
            target = _install(
                built,
                cache,
                "openai/gsm8k",
                "main",
                gsm8k_hash,
                f"GSM8K (openai/gsm8k, config main) from rlvr's local copy {args.gsm8k_dir} (sha256 prefix {sha}); "
                "written by scripts/tinker_client_env.sh, not downloaded.",
            )
        print(f"openai/gsm8k (main): written to {target}")

    if args.no_robots_substitute:
        nr_hash = f"SUBSTITUTE-gsm8k-{sha}"
        if (_cache_entry(cache, "HuggingFaceH4/no_robots", "default", nr_hash) / "dataset_info.json").is_file():
            print(f"HuggingFaceH4/no_robots: SUBSTITUTE up to date in {cache}")
        else:
            feats = datasets.Features(
                {
                    "prompt": datasets.Value("string"),
                    "prompt_id": datasets.Value("string"),
                    "messages": [{"content": datasets.Value("string"), "role": datasets.Value("string")}],
                    "category": datasets.Value("string"),
                }
            )
            with tempfile.TemporaryDirectory() as tmp:
                files = {}
                for split, path in (("train", src[0]), ("test", src[1])):
                    out = Path(tmp) / f"{split}.jsonl"
                    _write_substitute_split(path, out, split)
                    files[split] = str(out)
                built = _build(Json, Path(tmp) / "b", "no_robots", "default", files, feats)
                target = _install(
                    built,
                    cache,
                    "HuggingFaceH4/no_robots",
                    "default",
                    nr_hash,
                    "SUBSTITUTE, NOT No Robots: HuggingFaceH4/no_robots is not available offline. These are GSM8K "
                    f"question/answer pairs from {args.gsm8k_dir} (sha256 prefix {sha}) as user/assistant chats in "
                    "no_robots' schema, written by scripts/tinker_client_env.sh --no-robots-substitute.",
                )
            print(f"HuggingFaceH4/no_robots: SUBSTITUTE (GSM8K chats, not No Robots) written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
