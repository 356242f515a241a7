"""``aurora plan``: simulate a deployment before paying for it (see docs/PLANNING.md)."""

from __future__ import annotations

import argparse
import json

EPILOG = """examples:
  aurora plan deployment.toml                       # per-step timeline and summary
  aurora plan deployment.toml --json --plot t.png   # one JSON object, and the timeline as a picture
  aurora plan deployment.toml --calibrate codec.json wan.json   # per-component costs from our benchmarks
  aurora plan --model qwen3-8b --actors remote=8:2000 --link remote=800:60:0.0001 --batch-size 512 \\
      --tokens-per-rollout 4096 --train-s 20 --density 0.0085"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="simulate a deployment: step time, WAN bytes and cost, idle time, catch-up",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="plan file (.toml, .yaml, .json); flags override its fields")
    p.add_argument("--model", help="a Qwen3 size (qwen3-4b, 8B, ...)")
    p.add_argument("--home", help="home region (trainer, home bucket, Redis)")
    p.add_argument("--actors", action="append", default=[], metavar="REGION=N[:TOKENS_PER_S]",
                   help="actors in a region (repeatable)")
    p.add_argument("--link", action="append", default=[], metavar="REGION=MBIT[:RTT_MS[:LOSS]]",
                   help="the region's link to home (repeatable)")
    p.add_argument("--price", action="append", default=[], metavar="REGION=USD_PER_GB",
                   help="egress price into the region (repeatable)")
    for name, kind, what in (("batch-size", int, "prompts per step"),
                             ("tokens-per-rollout", float, "tokens generated per prompt (whole group)"),
                             ("train-s", float, "training time per step"), ("density", float, "changed fraction"),
                             ("bytes-per-changed", float, "delta bytes per changed element"),
                             ("streams", int, "parallel TCP streams per transfer"),
                             ("snapshot-every", int, "steps between full snapshots"),
                             ("preempt-per-hour", float, "spot preemptions per actor-hour"),
                             ("steps", int, "steps to simulate")):
        p.add_argument(f"--{name}", type=kind, help=what)
    p.add_argument("--spot", action="append", default=[], metavar="REGION", help="the region's actors are spot")
    p.add_argument("--calibrate", nargs="+", default=[], metavar="FILE",
                   help="benchmark JSON (codec / transfer / wan) or a run summary: per-component costs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-timeline", action="store_true", help="leave the per-step timeline out")
    p.add_argument("--plot", metavar="PNG", help="write the timeline as a picture")
    p.set_defaults(handler=cmd_plan)


def _pairs(values: list[str], flag: str) -> dict[str, list[str]]:
    from aurora_store.errors import PlanError

    out = {}
    for value in values:
        region, sep, rest = value.partition("=")
        if not sep or not region or not rest:
            raise PlanError(f"{flag}: expected REGION=..., got {value!r}")
        out[region] = rest.split(":")
    return out


def _number(text: str, flag: str) -> float:
    from aurora_store.errors import PlanError

    try:
        return float(text)
    except ValueError:
        raise PlanError(f"{flag}: {text!r} is not a number") from None


def plan_from_args(args: argparse.Namespace):
    from aurora_store.errors import PlanError
    from aurora_store.plan import config

    raw: dict = {}
    if args.config:
        base = config.load(args.config)
        raw = {"model": base.model.__dict__, "home": base.home, "regions": [r.__dict__ for r in base.regions],
               "costs": base.costs.__dict__,
               **{k: getattr(base, k) for k in config.Plan.__dataclass_fields__
                  if k not in ("model", "regions", "home", "costs")}}
    regions = {r["name"]: dict(r) for r in raw.get("regions", [])}
    for region, parts in _pairs(args.actors, "--actors").items():
        regions.setdefault(region, {"name": region})["actors"] = int(_number(parts[0], "--actors"))
        if len(parts) > 1:
            regions[region]["tokens_per_s"] = _number(parts[1], "--actors")
    for region, parts in _pairs(args.link, "--link").items():
        r = regions.setdefault(region, {"name": region})
        for key, part in zip(("link_mbit", "rtt_ms", "loss"), parts):
            r[key] = _number(part, "--link")
    for region, parts in _pairs(args.price, "--price").items():
        regions.setdefault(region, {"name": region})["egress_usd_per_gb"] = _number(parts[0], "--price")
    for region in args.spot:
        regions.setdefault(region, {"name": region})["spot"] = True
    if args.model:
        raw["model"] = args.model
    if args.home:
        raw["home"] = args.home
    if not regions:
        raise PlanError("no regions: give a plan file or --actors/--link")
    if "home" not in raw:  # the region without a link is home
        homes = [n for n, r in regions.items() if "link_mbit" not in r]
        raw["home"] = homes[0] if homes else "home"
    if raw["home"] not in regions:
        regions[raw["home"]] = {"name": raw["home"]}
    raw["regions"] = list(regions.values())
    for key in ("batch_size", "tokens_per_rollout", "train_s", "density", "bytes_per_changed", "streams",
                "snapshot_every", "preempt_per_hour", "steps"):
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    plan = config.from_mapping(raw)
    if args.calibrate:
        from aurora_store.plan import calibrate

        plan = calibrate.apply(plan, calibrate.read(args.calibrate))
    return plan


def cmd_plan(args: argparse.Namespace) -> int:
    from aurora_store.plan import report

    plan = plan_from_args(args)
    doc = report.build(plan, timeline=not args.no_timeline or bool(args.plot))
    if args.plot:
        report.plot(doc, args.plot)
        doc["plot"] = args.plot
    if args.no_timeline:
        doc.pop("timeline", None)
    print(json.dumps(doc) if args.json else report.text(doc))
    return 0
