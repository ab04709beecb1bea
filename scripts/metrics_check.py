#!/usr/bin/env python3
"""Checks a --metrics file of simple-ipc: Prometheus' text exposition format, read strictly here (each family's
HELP then TYPE once, before all its series; names simple_ipc_*, gauges, none ending in _total; label values
escaped as the format has them; finite values, no timestamps; no series twice), and again with
prometheus_client's parser where it is installed (pip install prometheus-client). Used by scripts/gpu-check.sh.

    scripts/metrics_check.py [--passed] [--no-xid] FILE

--passed: the run's status must be passed (simple_ipc_status{status="passed"} 1); --no-xid: no Xid error may be
named (no simple_ipc_xid_errors series). Prints one line (families, series, what else was checked) and exits 0,
or says what is wrong and exits 1.
"""

import math
import re
import sys

NAME = re.compile(r"simple_ipc_[a-z0-9_]+\Z")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def series_of(line):
    """The name, labels and value of one series' line."""
    name_end = min(i for i in (line.find("{"), line.find(" ")) if i >= 0)
    name, rest, labels = line[:name_end], line[name_end:], {}
    if rest.startswith("{"):
        i = 1
        while True:
            eq = rest.index("=", i)
            key = rest[i:eq]
            if not LABEL.match(key) or key.startswith("__"):
                raise ValueError(f"label name {key!r}")
            if rest[eq + 1] != '"':
                raise ValueError("a label value without its quote")
            i, value = eq + 2, []
            while True:
                c = rest[i]
                if c == "\\":
                    escaped = {"\\": "\\", '"': '"', "n": "\n"}.get(rest[i + 1])
                    if escaped is None:
                        raise ValueError(f"escape \\{rest[i + 1]}")
                    value.append(escaped)
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
            if key in labels:
                raise ValueError(f"label {key} twice")
            labels[key] = "".join(value)
            if rest[i] == ",":
                i += 1
            elif rest[i] == "}":
                rest = rest[i + 1:]
                break
            else:
                raise ValueError(f"{rest[i]!r} after a label")
    if not rest.startswith(" ") or " " in rest[1:]:
        raise ValueError("one space, then the value, and no timestamp")
    value = float(rest[1:])
    if not math.isfinite(value):
        raise ValueError("a value that is not finite")
    return name, labels, value


def strictly(text):
    """Every series of `text`, read strictly; raises ValueError with the line at fault."""
    if not text.endswith("\n"):
        raise ValueError("the text does not end with a newline")
    families, series, typed = [], {}, False
    for number, line in enumerate(text.splitlines(), 1):
        try:
            if line.startswith("# HELP "):
                name, _, help_ = line[7:].partition(" ")
                if name in families or not NAME.match(name) or name.endswith("_total") or not help_.strip():
                    raise ValueError(f"family {name}")
                families.append(name)
                typed = False
            elif line.startswith("# TYPE "):
                if not families or line[7:] != f"{families[-1]} gauge":
                    raise ValueError("TYPE is not the gauge of the family its HELP began")
                typed = True
            else:
                name, labels, value = series_of(line)
                if not typed or name != families[-1]:
                    raise ValueError("a series outside its family")
                key = (name, tuple(sorted(labels.items())))
                if key in series:
                    raise ValueError("a series twice")
                series[key] = value
        except (ValueError, IndexError) as e:
            raise ValueError(f"line {number}: {e}: {line}") from None
    return families, series


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    files = [a for a in argv if not a.startswith("--")]
    if len(files) != 1 or flags - {"--passed", "--no-xid"}:
        print(__doc__.strip().splitlines()[-5], file=sys.stderr)
        return 1
    text = open(files[0], encoding="utf-8").read()
    try:
        families, series = strictly(text)
    except ValueError as e:
        print(f"not the exposition format: {e}")
        return 1
    said = [f"{len(families)} families, {len(series)} series read strictly"]
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        said.append("prometheus_client not installed")
    else:
        parsed = sum(len(f.samples) for f in text_string_to_metric_families(text))
        if parsed != len(series):
            print(f"prometheus_client read {parsed} series, this {len(series)}")
            return 1
        said.append(f"prometheus_client read the same {parsed}")
    if "--passed" in flags:
        if series.get(("simple_ipc_status", (("status", "passed"),))) != 1:
            statuses = [f"{dict(k[1])['status']}={v:g}" for k, v in series.items() if k[0] == "simple_ipc_status"]
            print("the run did not pass: " + ", ".join(statuses))
            return 1
        said.append("status passed")
    if "--no-xid" in flags:
        xids = [dict(k[1]) for k in series if k[0] == "simple_ipc_xid_errors"]
        if xids:
            print(f"Xid errors named: {xids}")
            return 1
        said.append("no Xid named")
    print("; ".join(said))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
