"""`edgespec netem ...`: profiles, tc/netem on real hosts, the userspace relay, measuring."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading

from edgespec.shared.errors import EdgespecError


def register(subparsers) -> None:
    p = subparsers.add_parser("netem", help="network emulation: profiles, tc/netem, relay, measure",
                              description=__doc__)
    sub = p.add_subparsers(dest="netem_command", metavar="ACTION", required=True)

    s = sub.add_parser("profiles", help="list the packaged profiles, or show one")
    s.add_argument("profile", nargs="?", help="name or YAML path to show")
    s.set_defaults(func=_profiles)

    s = sub.add_parser("check", help="say whether this host can shape with tc/netem")
    s.set_defaults(func=_check)

    s = sub.add_parser("apply", help="shape an interface's egress with tc/netem")
    s.add_argument("profile", help="profile name (4g, 5g, ...) or YAML path")
    s.add_argument("--dev", required=True, help="network interface, e.g. eth0")
    s.add_argument("--direction", choices=("up", "down"), default="up",
                   help="which side of the profile this host sends: up on the client host "
                        "(default), down on the server host")
    s.add_argument("--dry-run", action="store_true", help="print the tc command, run nothing")
    s.set_defaults(func=_apply)

    s = sub.add_parser("clear", help="remove the shaping from an interface")
    s.add_argument("--dev", required=True)
    s.add_argument("--dry-run", action="store_true")
    s.set_defaults(func=_clear)

    lab = sub.add_parser("lab", help="two network namespaces joined by a shaped veth pair")
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="up|down", required=True)
    s = lab_sub.add_parser("up", help="create the namespaces and shape both directions")
    s.add_argument("profile")
    _lab_args(s)
    s.set_defaults(func=_lab_up)
    s = lab_sub.add_parser("down", help="delete the namespaces (and the veth pair with them)")
    s.add_argument("profile", nargs="?", help="ignored; accepted so `lab up X` / `lab down X` pair")
    _lab_args(s)
    s.set_defaults(func=_lab_down)

    s = sub.add_parser("relay", help="run the userspace relay: a TCP proxy that applies a profile")
    s.add_argument("profile")
    s.add_argument("--listen", default="127.0.0.1:50052", help="HOST:PORT clients connect to")
    s.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    s.add_argument("--seed", type=int, default=None, help="seed of the delay and loss draws")
    s.add_argument("--cut-after-bytes", type=int, default=None,
                   help="cut the link once this many bytes went downstream")
    s.add_argument("--cut-mode", choices=("blackhole", "reset"), default="blackhole")
    s.add_argument("--no-schedule", action="store_true", help="ignore the profile's outage schedule")
    s.add_argument("--stats-every", type=float, default=0, help="print stats every S seconds")
    _nice_arg(s)
    s.add_argument("--no-control", action="store_true",
                   help="do not read commands (cut blackhole|reset, restore, stats) from stdin")
    s.set_defaults(func=_relay)

    s = sub.add_parser("measure", help="measure round trips and throughput through a relay or a lab")
    s.add_argument("profile", nargs="?", help="profile to run a local relay with (and compare to)")
    s.add_argument("--target", help="HOST:PORT of an `edgespec netem echo` behind a link; "
                                     "without it a relay with PROFILE runs here")
    s.add_argument("--pings", type=int, default=400, help="round trips to time")
    s.add_argument("--connections", type=int, default=4, help="parallel ping connections")
    s.add_argument("--bytes", type=int, default=3_000_000, help="bytes each way for throughput (0: skip)")
    s.add_argument("--seed", type=int, default=1)
    _nice_arg(s)
    s.set_defaults(func=_measure)

    s = sub.add_parser("echo", help="run the echo server `measure --target` talks to")
    s.add_argument("--listen", default="0.0.0.0:9009")
    s.set_defaults(func=_echo)


def _lab_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--name", default="es", help="prefix of namespaces and veth ends (default es)")
    s.add_argument("--subnet", default="10.77.0.0/24", help="veth subnet: client .1, server .2")
    s.add_argument("--dry-run", action="store_true", help="print the ip and tc commands, run nothing")


def _nice_arg(s: argparse.ArgumentParser) -> None:
    s.add_argument("--nice", type=int, default=None,
                   help="run at this nice value, e.g. -10 (needs root): the relay sleeps almost all "
                        "the time, but on a busy host it must be woken on time to keep the delays")


def _renice(value: int | None) -> None:
    if value is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)
    except OSError as exc:
        raise EdgespecError(f"--nice {value}: cannot change this process's priority ({exc}); "
                            f"a negative value needs root") from None


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _host_port(text: str, what: str) -> tuple[str, int]:
    try:
        return host_port(text)
    except argparse.ArgumentTypeError as exc:
        raise EdgespecError(f"{what}: {exc}") from None


def _profiles(args) -> int:
    from .profile import load_profile, profile_names

    if args.profile:
        p = load_profile(args.profile)
        print(f"{p.name}: {p.description}".rstrip())
        for name in ("up", "down"):
            d = p.direction(name)
            rate = "unlimited" if d.rate_mbit is None else f"{d.rate_mbit:g} Mbit/s"
            trace = f", trace {d.trace.path.name} ({d.trace.format})" if d.trace else ""
            print(f"  {name:4}: delay {d.delay.distribution} {d.delay.mean_ms:g} ms +- "
                  f"{d.delay.deviation_ms:g} ms (mean drawn {d.delay.expected_ms():.2f} ms), "
                  f"rate {rate}, loss {d.loss_percent:g} %{trace}")
        print(f"  loss costs one RTO of {p.rto_s() * 1000:.0f} ms; outages: {p.outages or 'none'}")
        return 0
    for name in profile_names():
        print(f"{name:10} {load_profile(name).description}")
    return 0


def _check(args) -> int:
    from .tc import probe_netem

    probe = probe_netem()
    word = {True: "available", False: "NOT available", None: "unknown"}[probe.available]
    print(f"netem qdisc: {word}: {probe.detail}")
    if not probe.available:
        print("use the userspace relay instead: edgespec netem relay PROFILE --listen HOST:PORT "
              "--upstream HOST:PORT")
    return 0 if probe.available else 1


def _shape(commands, profile_name: str | None, dry_run: bool, notes=(), check=None, undo=()) -> bool:
    """Print the commands (dry run) or run them, after tc's check when shaping with a profile and then `check()`;
    a failed run runs the `undo` commands, so nothing is left half-built. True if run."""
    from .tc import format_commands, require_netem, run_commands, run_ignoring_errors

    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if dry_run:
        print(format_commands(commands))
        return False
    if profile_name is not None:
        require_netem(profile_name)
    if check is not None:
        check()
    try:
        run_commands(commands)
    except Exception:
        run_ignoring_errors(undo)
        raise
    return True


def _apply(args) -> int:
    from .profile import load_profile
    from .tc import apply_commands, notes_for

    profile = load_profile(args.profile)
    if _shape(apply_commands(profile, args.dev, args.direction), args.profile, args.dry_run, notes_for(profile)):
        print(f"{args.dev}: shaped with {profile.name} ({args.direction})")
    return 0


def _clear(args) -> int:
    from .tc import clear_commands

    _shape(clear_commands(args.dev), None, args.dry_run)
    return 0


def _lab_up(args) -> int:
    from .profile import load_profile
    from .tc import LabConfig, lab_down_commands, lab_exists, lab_instructions, lab_up_commands, notes_for

    profile = load_profile(args.profile)
    lab = LabConfig(args.name, args.subnet)

    def check() -> None:
        if lab_exists(lab):
            raise EdgespecError(f"lab {lab.name!r} exists already: `edgespec netem lab down --name "
                                f"{lab.name}` first, or pick another --name")

    if _shape(lab_up_commands(profile, lab), args.profile, args.dry_run, notes_for(profile), check,
              undo=lab_down_commands(lab)):
        print(lab_instructions(profile, lab))
    return 0


def _lab_down(args) -> int:
    from .tc import LabConfig, lab_down_commands

    _shape(lab_down_commands(LabConfig(args.name, args.subnet)), None, args.dry_run)
    return 0


def _relay(args) -> int:
    from .profile import load_profile

    profile = load_profile(args.profile)
    _renice(args.nice)
    listen = _host_port(args.listen, "--listen")
    upstream = _host_port(args.upstream, "--upstream")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run_relay(profile, listen, upstream, args))
    return 0


async def _run_relay(profile, listen, upstream, args) -> None:
    from .relay import Relay

    relay = Relay(profile, upstream, listen=listen, seed=args.seed,
                  run_schedule=not args.no_schedule)
    async with relay:
        print(f"relay {profile.name}: {relay.address[0]}:{relay.port} -> {upstream[0]}:{upstream[1]}"
              f" (Ctrl-C stops)", flush=True)
        if args.cut_after_bytes is not None:
            relay.cut_after_bytes(args.cut_after_bytes, args.cut_mode, "down")
        if not args.no_control:
            _read_control(relay, asyncio.get_running_loop())
        try:
            while True:
                await asyncio.sleep(args.stats_every or 3600)
                if args.stats_every:
                    print(relay.stats(), flush=True)
        finally:
            print(relay.stats(), flush=True)


def _read_control(relay, loop) -> None:
    """Drive the relay from stdin, one command a line; a thread, since stdin may be a pipe."""
    def apply(line: str) -> None:
        words = line.split()
        try:
            if words[:1] == ["cut"]:
                relay.cut(words[1] if len(words) > 1 else "blackhole")
            elif words == ["restore"]:
                relay.restore()
            elif words == ["stats"]:
                pass
            else:
                print("commands: cut [blackhole|reset], restore, stats", flush=True)
                return
        except ValueError as exc:
            print(exc, flush=True)
            return
        print(relay.stats(), flush=True)

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(apply, line)

    threading.Thread(target=read, name="relay-control", daemon=True).start()


def _measure(args) -> int:
    from .measure import format_measurement
    from .profile import load_profile

    if not args.profile and not args.target:
        raise EdgespecError("measure needs a PROFILE (to run a relay here) or --target HOST:PORT")
    profile = load_profile(args.profile) if args.profile else None
    target = _host_port(args.target, "--target") if args.target else None
    _renice(args.nice)
    m, overhead, where = asyncio.run(_measure_async(profile, target, args))
    print(f"measured {where}: {args.pings} pings over {args.connections} connections, "
          f"{args.bytes} bytes each way")
    print(format_measurement(m, profile, overhead))
    return 0


async def _measure_async(profile, target, args):
    from .measure import measure_link, ping_rtts, start_echo_server
    from .profile import load_profile
    from .relay import Relay

    if target is not None:
        m = await measure_link(*target, args.pings, args.connections, args.bytes)
        return m, None, f"through {target[0]}:{target[1]}"
    echo = await start_echo_server()
    addr = echo.sockets[0].getsockname()[:2]
    try:
        async with Relay(load_profile("ideal"), addr) as ideal:  # the relay's own cost
            rtts = await ping_rtts(*ideal.address, 200, args.connections)
        async with Relay(profile, addr, seed=args.seed) as relay:
            m = await measure_link(*relay.address, args.pings, args.connections, args.bytes)
    finally:
        echo.close()
    overhead = 1000 * sum(rtts) / len(rtts)
    return m, overhead, f"through a local relay with profile {profile.name!r} (seed {args.seed})"


def _echo(args) -> int:
    from .measure import start_echo_server

    host, port = _host_port(args.listen, "--listen")

    async def serve() -> None:
        server = await start_echo_server(host, port)
        print(f"echo server on {host}:{server.sockets[0].getsockname()[1]} (Ctrl-C stops)", flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0
