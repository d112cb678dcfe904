"""`specflip releases`: the SGLang release lines specflip supports (shim/releases/), what works on each and where it
was verified."""

from __future__ import annotations

import json
from typing import Any

from shim import releases
from shim.releases.base import FEATURES


def table() -> dict[str, Any]:
    """Every supported line, its features and where each was verified, and the installed release's line."""
    installed = releases.installed_release()
    try:
        installed_line: str | None = releases.release_line(installed).version if installed else None
    except releases.UnsupportedRelease:
        installed_line = None
    lines = []
    for line in releases.all_lines():
        how = line.features()
        lines.append({
            "release": line.version,
            "releases": f"{line.version} and its .postN releases",
            "workers": ["v1", "v2"] if line.ships_v1_worker else ["v2"],
            "features": {f: {"works": how[f], "verified": [where for feature, where in line.verified if feature == f]}
                         for f in FEATURES},
        })
    return {"supported": releases.supported_range(), "installed": installed, "installed_line": installed_line,
            "lines": lines}


def render(data: dict[str, Any]) -> str:
    out = [f"specflip supports {data['supported']} (a .postN release uses its base line)."]
    if data["installed"] is None:
        out.append("installed: no sglang")
    else:
        line = data["installed_line"]
        out.append(f"installed: sglang {data['installed']}" + (f" (line {line})" if line else " (not supported)"))
    for line in data["lines"]:
        out.append("")
        out.append(f"SGLang {line['release']} (EAGLE workers: {', '.join(line['workers'])})")
        for feature, entry in line["features"].items():
            out.append(f"  {feature}: {entry['works']}")
            for where in entry["verified"] or ["not verified on this line"]:
                out.append(f"    verified: {where}")
    return "\n".join(out)


def main(as_json: bool) -> int:
    data = table()
    print(json.dumps(data, indent=2) if as_json else render(data))
    return 0
