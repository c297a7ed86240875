"""Copy each case's tolerance and convention from cases.py into data/manifest.json (no
framework needed).

Run after changing a tolerance or relabelling a case's convention in cases.py (the torch cases
recorded with ``fused=True`` became "torch_fused"): ``python conformance/generators/sync_manifest.py``.
The recorded arrays do not change, so the generators need not run again.
"""

import fcntl
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
from store import DATA  # noqa: E402

path = os.path.join(DATA, "manifest.json")
with open(os.path.join(DATA, ".manifest.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # the generators write the manifest under this lock
    with open(path) as f:
        manifest = json.load(f)
    by_id = {c["id"]: c for c in cases.CASES}
    for entry in manifest["cases"]:
        case = by_id[entry["id"]]
        entry["tolerance_ulp"] = case["tolerance_ulp"]
        entry["tolerance_reason"] = case["tolerance_reason"]
        entry["convention"] = case["convention"]
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
print(f"{len(manifest['cases'])} entries synced")
