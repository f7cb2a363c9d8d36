"""``certeval up`` / ``certeval down``: a Ray head and a Prefect server that later commands reuse
(certeval.services.up_down). The record they share is checked as data; ``down`` signals only processes it verifies."""

from __future__ import annotations

import os

from certeval.errors import InputError


def add_parser(subparsers) -> None:
    up = subparsers.add_parser("up", help="start a local Ray and Prefect server that later runs from this folder reuse",
                               description="Start a Ray head and a Prefect server on 127.0.0.1 that outlive this "
                                           "command; runs started from this working folder without their own Ray or "
                                           "Prefect settings connect to them (no start-up wait). certeval down stops "
                                           "them.")
    up.add_argument("--num-cpus", type=int, default=None, help="CPUs of the Ray head (default: this machine's)")
    up.set_defaults(func=run_up, command="up")
    down = subparsers.add_parser("down", help="stop what certeval up started in this folder",
                                 description="Stop the Ray head and Prefect server certeval up started from this "
                                             "working folder, and forget them. Only processes that are still the "
                                             "ones up started (same id, start time and command line) are signalled.")
    down.add_argument("--force", action="store_true",
                      help="stop them even while runs from this folder are using them (those runs then fail, "
                           "resumable with their --run-id)")
    down.set_defaults(func=run_down, command="down")


def run_up(args) -> int:
    from certeval.runtime.envsetup import configure_offline_env
    from certeval.services.up_down import load_services, record_lock, services_file, start_services

    cpus = (os.cpu_count() or 2) if args.num_cpus is None else args.num_cpus
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise InputError(f"--num-cpus must be a positive integer, got {args.num_cpus!r}")
    load_services()  # a record that is not one: exit 2, nothing started, created or changed
    configure_offline_env()
    with record_lock(services_file().parent):  # up is exclusive: a second one waits its turn, then finds it up
        known = load_services()
        if known is not None and known.alive():
            print(f"certeval: already up (Ray {known.ray_address}, Prefect {known.prefect_api_url}); "
                  f"{services_file()}")
            return 0
        if known is not None and known.verified():
            raise InputError(f"{services_file()} names processes of a certeval up that is still starting or was "
                             "stopped half-way; run certeval down first")
        services = start_services(cpus)
    print(f"certeval: up: Ray {services.ray_address} ({cpus} CPUs), Prefect {services.prefect_api_url}; runs from "
          f"this folder use them until certeval down ({services_file()})")
    return 0


def run_down(args) -> int:
    from certeval.services.up_down import live_users, load_services, record_lock, services_file, stop_services

    path = services_file()
    if load_services() is None:
        print(f"certeval: nothing to stop ({path} does not exist)")
        return 0
    with record_lock(path.parent):
        known = load_services()  # again, under the lock: another down may have stopped them meanwhile
        if known is None:
            print(f"certeval: nothing to stop ({path} does not exist)")
            return 0
        users = live_users(known)
        if users and not getattr(args, "force", False):
            raise InputError(f"certeval down: run(s) with pid {', '.join(map(str, users))} are using the services; "
                             "wait for them to end (or stop them: they resume with their --run-id), or pass --force")
        done = stop_services(known)
    left = done["left_alone"]
    note = (f"; left alone pid {', '.join(map(str, left))}: no longer what certeval up started (a stale record)"
            if left else "")
    what = "Ray and Prefect stopped" if done["stopped"] else "nothing was running"
    print(f"certeval: down: {what}{note}; {path} removed")
    return 0
