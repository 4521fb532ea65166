"""Runs the ClickHouse SQL in clickhouse/ on access logs with chdb (embedded ClickHouse) and
compares its capacity, production-traffic, service-level, per-user and per-second rows with
`tokenmeter analyze --json --per-second` of the same logs. Usage: clickhouse_check.py LOG_GLOB
ANALYZE_JSON. Exits non-zero on a difference. The objective's counts (tm_objective) are set to
analyze's `service_level.objective`."""

import json
import math
import os
import re
import sys
import tempfile

from chdb import session

HERE = os.path.dirname(os.path.abspath(__file__))
SQL = os.path.join(HERE, "..", "clickhouse")
TOLERANCE = 0.005


def statements(name):
    text = open(os.path.join(SQL, name)).read()
    lines = [l for l in text.splitlines() if not l.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def rows(sess, sql):
    out = sess.query(sql, "JSONEachRow").bytes().decode()
    return [json.loads(l) for l in out.splitlines() if l.strip()]


failures = []
# The largest relative difference seen per table (capacity, users, per-second) and figure.
worst = {}


def close(what, got, want, tol=TOLERANCE):
    if got is None or want is None:
        if got is not want and not (got is None and want is None):
            failures.append(f"{what}: sql {got} vs analyze {want}")
        return
    if isinstance(want, float) and math.isnan(want):
        return
    scale = max(abs(want), 1e-9)
    table = what.split(" ")[0]
    table = (
        "capacity" if table.startswith("N=")
        else "production" if table.startswith("P=")
        else "service level" if table.startswith("S=")
        else "per-second" if table == "second"
        else "users"
    )
    table += ": " + what.split(" ", 2 if table == "per-second" else 1)[-1]
    rel = abs(got - want) / scale if abs(got - want) > 1e-6 else 0.0
    if rel >= worst.get(table, (0.0, ""))[0]:
        worst[table] = (rel, what)
    if abs(got - want) / scale > tol and abs(got - want) > 1e-6:
        failures.append(f"{what}: sql {got} vs analyze {want}")


def objective_view(sql, objective):
    """tm_objective's definition with analyze's objective in place of the defaults."""
    out = re.sub(r"SELECT [0-9.]+ AS attainment_pct",
                 f"SELECT {float(objective['attainment_pct'])!r} AS attainment_pct", sql)
    out = re.sub(r"toUInt64\([0-9]+\) AS min_requests",
                 f"toUInt64({int(objective['min_requests'])}) AS min_requests", out)
    out = re.sub(r"[0-9.]+ AS max_tpot_ms", f"{float(objective['max_tpot_ms'])!r} AS max_tpot_ms", out)
    return out


def level_pairs(what, got_rows, want_rows):
    """The SQL's rows paired with analyze's by level; a different list of levels is a failure."""
    got_levels = [int(r["in_flight"]) for r in got_rows]
    want_levels = [r["in_flight"] for r in want_rows]
    if got_levels != want_levels:
        failures.append(f"{what} levels: sql {got_levels} vs {want_levels}")
    return zip(got_rows, want_rows)


def compare_service_level(sess, want):
    """service_level.sql's table, headline and model against analyze's `service_level`."""
    rows_sql, head_sql, model_sql = statements("service_level.sql")
    got_rows = rows(sess, rows_sql)
    levels = want["levels"]
    for got, w in level_pairs("service", got_rows, levels):
        n = w["in_flight"]
        for k in ("requests", "met"):
            if int(got[k]) != w[k]:
                failures.append(f"S={n} {k}: sql {got[k]} vs analyze {w[k]}")
        if bool(got["thin"]) != w["thin"]:
            failures.append(f"S={n} thin: sql {got['thin']} vs analyze {w['thin']}")
        for k, v in w["missed"].items():
            if int(got[f"missed_{k}"]) != v:
                failures.append(f"S={n} missed {k}: sql {got[f'missed_{k}']} vs analyze {v}")
        close(f"S={n} attainment", got["attainment_pct"], w["attainment_pct"])
        ci = w["attainment_ci_pct"] or [None, None]
        close(f"S={n} attainment ci lo", got["attainment_ci_lo_pct"], ci[0])
        close(f"S={n} attainment ci hi", got["attainment_ci_hi_pct"], ci[1])
        close(f"S={n} clean seconds", got["seconds"], w["seconds"])
        for k in ("gen_tok_s", "per_request_tok_s", "goodput_tok_s", "model_per_request_tok_s"):
            close(f"S={n} {k}", got[k], w[k])
        # The interval's half-width, against the rate it bounds: a near-zero width (an exact
        # pace) differs relatively by float order alone.
        g, wc = got["gen_tok_s_ci"], w["gen_tok_s_ci"]
        if (g is None) != (wc is None):
            failures.append(f"S={n} gen_tok_s_ci: sql {g} vs analyze {wc}")
        elif g is not None:
            rate = max(abs(w["gen_tok_s"] or 0.0), 1e-9)
            rel = abs(g - wc) / rate
            if rel >= worst.get("service level: gen_tok_s_ci / gen_tok_s", (0.0, ""))[0]:
                worst["service level: gen_tok_s_ci / gen_tok_s"] = (rel, f"S={n}")
            if rel > TOLERANCE:
                failures.append(f"S={n} gen_tok_s_ci: sql {g} vs analyze {wc}")
        band = w["model_band_tok_s"] or [None, None]
        close(f"S={n} model band lo", got["model_band_lo_tok_s"], band[0])
        close(f"S={n} model band hi", got["model_band_hi_tok_s"], band[1])
    (head,) = rows(sess, head_sql)
    cap = want["capacity"]
    for k in ("in_flight", "reached", "binds", "first_miss", "reason", "text"):
        g = head[k]
        if k == "reached":
            g = bool(g)
        elif k in ("in_flight", "first_miss") and g is not None:
            g = int(g)
        if g != cap[k]:
            failures.append(f"headline {k}: sql {g!r} vs analyze {cap[k]!r}")
    (model,) = rows(sess, model_sql)
    m = want["model"]
    if m is None:
        if model["a_ms"] is not None or model["reason"] != want["model_reason"]:
            failures.append(f"model: sql {model} vs analyze none ({want['model_reason']})")
    else:
        close("S=model a_ms", model["a_ms"], m["a_ms"])
        close("S=model b_ms", model["b_ms"], m["b_ms"])
        close("S=model seconds", model["seconds"], m["seconds"])
        for k, g in (("levels", model["levels"]), ("range", [model["range_lo"], model["range_hi"]]),
                     ("pace_capacity", model["pace_capacity"])):
            g = [int(x) for x in g] if isinstance(g, list) else (None if g is None else int(g))
            if g != m[k]:
                failures.append(f"model {k}: sql {g} vs analyze {m[k]}")
    return got_rows, head


def main():
    log, report_path = sys.argv[1], sys.argv[2]
    report = json.load(open(report_path))
    with tempfile.TemporaryDirectory() as tmp:
        sess = session.Session(tmp)
        sess.query("CREATE DATABASE IF NOT EXISTS tm")
        sess.query("USE tm")
        objective = report["service_level"]["objective"]
        for s in statements("access_log.sql") + statements("views.sql"):
            if "CREATE VIEW IF NOT EXISTS tm_objective" in s:
                s = objective_view(s, objective)
            sess.query(s)
        (ingest,) = statements("ingest.sql")
        sess.query(ingest.replace("{path}", os.path.abspath(log)))
        n = rows(sess, "SELECT count() AS n FROM access_log")[0]["n"]
        if int(n) != report["summary"]["requests"]:
            failures.append(f"rows {n} vs analyze requests {report['summary']['requests']}")

        (cap_sql,) = statements("capacity.sql")
        cap = rows(sess, cap_sql)
        want = report["capacity"]
        for got, w in level_pairs("capacity", cap, want):
            n = w["in_flight"]
            if int(got["seconds"]) != w["seconds"]:
                failures.append(f"N={n} seconds: sql {got['seconds']} vs analyze {w['seconds']}")
            close(f"N={n} gen mean", got["gen_tok_s_mean"], w["gen_tok_s"]["mean"])
            close(f"N={n} gen stdev", got["gen_tok_s_stdev"], w["gen_tok_s"]["stdev"], 0.01)
            pr = w["per_request_tok_s"]
            close(f"N={n} per-request avg", got["per_request_tok_s_avg"], pr["avg"])
            close(f"N={n} per-request min", got["per_request_tok_s_min"], pr["min"])
            close(f"N={n} per-request max", got["per_request_tok_s_max"], pr["max"])
            for p in ("p50", "p90", "p99"):
                close(f"N={n} ttft {p}", got[f"ttft_{p}_ms"], w["ttft_ms"][p])
            close(f"N={n} scaling", got["scaling"], w["scaling"])
            close(f"N={n} marginal", got["marginal_gain"], w["marginal_gain"], 0.01)

        prod_sql, placed_sql = statements("production.sql")
        prod = rows(sess, prod_sql)
        want = report["capacity_production"]
        for got, w in level_pairs("production", prod, want):
            n = w["in_flight"]
            if bool(got["thin"]) != w["thin"]:
                failures.append(f"P={n} thin: sql {got['thin']} vs analyze {w['thin']}")
            for k in ("seconds", "guard_s", "tokens", "gen_tok_s", "gen_tok_s_unguarded", "scaling"):
                close(f"P={n} {k}", got[k], w[k])
            close(f"P={n} marginal", got["marginal_gain"], w["marginal_gain"], 0.01)
            pr = w["per_request_tok_s"]
            for k in ("min", "avg", "max"):
                close(f"P={n} per-request {k}", got[f"per_request_tok_s_{k}"], pr[k])
            for p in ("p50", "p90", "p99"):
                close(f"P={n} ttft {p}", got[f"ttft_{p}_ms"], w["ttft_ms"][p])
        (placed,) = rows(sess, placed_sql)
        for k, v in report["capacity_production_tokens"].items():
            if int(placed[k]) != v:
                failures.append(f"production tokens {k}: sql {placed[k]} vs analyze {v}")

        service, head = compare_service_level(sess, report["service_level"])

        (users_sql,) = statements("users.sql")
        users = rows(sess, users_sql)
        wu = report["users"]
        if [u["user"] for u in users] != [u["user"] for u in wu]:
            failures.append("user order differs")
        for got, w in zip(users, wu):
            u = w["user"]
            for k in ("requests", "generation_requests", "completion_tokens"):
                if int(got[k]) != w[k]:
                    failures.append(f"{u} {k}: sql {got[k]} vs analyze {w[k]}")
            for k in ("min", "mean", "max"):
                close(f"{u} tok_s {k}", got[f"tok_s_{k}"], w["tok_s"][k])
            close(f"{u} ttft p50", got["ttft_p50_ms"], w["ttft_p50_ms"])
            close(f"{u} ttft p90", got["ttft_p90_ms"], w["ttft_p90_ms"])
            close(f"{u} share", got["share_pct"], w["share_pct"])

        (ps_sql,) = statements("per_second.sql")
        per_sec = {int(r["sec"]): r for r in rows(sess, ps_sql)}
        series = report["timeline"].get("per_second") or []
        checked = 0
        for s in series:
            sec = s["t"]
            got = per_sec.get(int(sec))
            close(f"second {sec} gen", got["gen_tokens"] if got else 0.0, s["gen_tokens"], 1e-6)
            close(f"second {sec} prompt", got["prompt_tokens"] if got else 0.0, s["prompt_tokens"], 1e-6)
            # The SQL reproduces the strict flag (no change inside the second), which the capacity
            # table rests on; analyze's tolerant `steady` needs each second's level mix.
            steady = (got or {}).get("steady_in_flight")
            if s["steady_strict"] != (steady is not None) or (steady is not None and int(steady) != s["in_flight_min"]):
                failures.append(f"second {sec} steady_strict: sql {steady} vs analyze {s['steady_strict']} at {s['in_flight_min']}")
            checked += 1
        print(
            f"clickhouse: {len(cap)} capacity rows, {len(prod)} production rows, "
            f"{len(service)} service-level rows (headline {head['text']!r}), {len(users)} users, "
            f"{checked} seconds compared; {len(failures)} differences"
        )
        for table, (rel, what) in sorted(worst.items()):
            print(f"  largest relative difference, {table}: {rel * 100:.4f} % ({what})")
        for f in failures[:40]:
            print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
