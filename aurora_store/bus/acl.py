"""Per-role Redis ACL users: what the trainer, a relay and an actor may read and write.

Every actor host holds a Redis credential, so the actor role gets only what an actor needs, and reads nothing
another actor wrote: it may read version events, its work stream, the trainer's and the relays' states; it
may *write, never read* actor states, the results stream, membership and the run log (``%W~``: an actor
cannot read another actor's registration, or any result, and cannot consume or acknowledge the trainer's
results). It cannot write events, leases or the trainer's state. A relay reads and writes version events and
its own state, reads the trainer's state, writes the run log. The trainer has every key of the run's prefix.
No role has the dangerous commands (``KEYS``, ``FLUSHALL``, ``CONFIG``, ``DEBUG``, …); the operator keeps the
default user (``aurora status``, ``gc``, notebooks).

The rules are plain ``ACL SETUSER`` arguments: :func:`provision` applies them to a server we run (the local
cluster, ``make demo``, the tests); ``infra/terraform`` gives ElastiCache users the same rules as access
strings (:func:`access_string`; ``python -m aurora_store.bus.acl`` writes them into the ``aws-redis`` module, and
``tests/infra`` fails when the two differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from aurora_store.bus.redis_keys import RunKeys
from aurora_store.errors import ConfigError

ROLES = ("trainer", "relay", "actor")

# Commands of the connection itself (redis-py's handshake, health checks, pipelines, and ``INFO server``, whose
# run id tells a client that the server restarted) every role needs; applied after the role's own rules, so
# that the trainer's ``-@dangerous`` does not take them back.
_CONNECTION = ("+info|server", "+ping", "+auth", "+hello", "+client|setinfo", "+client|id", "+select", "+time",
               "+multi", "+exec", "+discard", "+echo")
_COMMANDS: Mapping[str, tuple[str, ...]] = {
    "trainer": ("+@read", "+@write", "+@stream", "+@hash", "+@set", "+@keyspace", "+@connection", "+@transaction",
                "-@dangerous"),
    "relay": ("+xread", "+xrevrange", "+xrange", "+xadd", "+hset", "+hgetall", "+expire", "+sadd", "+smembers"),
    "actor": ("+xread", "+xrevrange", "+xadd", "+hset", "+hgetall", "+expire", "+del", "+sadd", "+srem",
              "+smembers"),
}


def key_rules(role: str, run: str = "*") -> list[str]:
    """The key patterns of ``role`` for ``run`` (``*``: every run of the server)."""
    k = RunKeys(run)
    if role == "trainer":
        return [f"~{k.prefix}*"]
    if role == "relay":
        return [f"~{k.events('*')}", f"~{k.relay('*')}", f"~{k.relays}", f"%R~{k.trainer}", f"%W~{k.run_log}"]
    if role == "actor":
        return [f"%R~{k.events('*')}", f"%R~{k.work('*')}", f"%R~{k.trainer}", f"%R~{k.relay('*')}",
                f"%R~{k.relays}", f"%W~{k.actor('*')}", f"%W~{k.actors}", f"%W~{k.results}",
                f"%W~{k.membership}", f"%W~{k.run_log}"]
    raise ConfigError(f"unknown Redis role {role!r}; roles are {', '.join(ROLES)}")


def rules(role: str, run: str = "*") -> list[str]:
    """Every ``ACL SETUSER`` rule of ``role`` but its password: ``resetkeys``/``-@all`` first, so re-applying
    them to an existing user leaves nothing older behind."""
    return ["resetkeys", "resetchannels", "-@all", *_COMMANDS[role], *_CONNECTION, *key_rules(role, run)]


def provision(client: redis.Redis, passwords: Mapping[str, str], run: str = "*") -> None:
    """Create (or reset) one ACL user per role in ``passwords`` (role → password) on the server of ``client``,
    which must be allowed ``ACL SETUSER`` (the operator's user)."""
    for role, password in passwords.items():
        if len(password) < 16:
            raise ConfigError(f"the {role} user's password must be at least 16 characters")
        client.execute_command("ACL", "SETUSER", role, "reset", "on", f">{password}", *rules(role, run))


def role_url(url: str, role: str, password: str) -> str:
    """``url`` with ``role``'s credentials in place of any it had (``redis://role:password@host:port/db``)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"))


# ElastiCache sets passwords through its API and refuses them (and ``reset``) in an access string; a user it creates
# starts without keys, and channels matter to no role (none has a ``@pubsub`` command): so the access string is
# ``on`` and the rules without their ``reset…`` words.
_NOT_IN_ACCESS_STRINGS = ("resetkeys", "resetchannels")
# Stands for the run's name in the generated Terraform file (Terraform replaces it with ``var.run``).
TERRAFORM_RUN = "<run>"
TERRAFORM_FILE = "infra/terraform/modules/aws-redis/access_strings.tf"


def access_string(role: str, run: str = "*") -> str:
    """``role``'s rules for ``run`` as the access string of an ElastiCache (RBAC) user."""
    return " ".join(["on", *(r for r in rules(role, run) if r not in _NOT_IN_ACCESS_STRINGS)])


def terraform_access_strings() -> str:
    """The ``aws-redis`` module's ``access_strings.tf``: every role's access string, ``<run>`` standing for the
    run's name."""
    width = max(len(role) for role in ROLES)
    lines = [f'    {role.ljust(width)} = "{access_string(role, TERRAFORM_RUN)}"' for role in ROLES]
    return "\n".join([
        "# Generated by `python -m aurora_store.bus.acl > " + TERRAFORM_FILE + "` from the per-role",
        "# rules of aurora_store/bus/acl.py (tests/infra/test_terraform.py fails when they differ). Do not edit.",
        "",
        "locals {",
        "  access_string_templates = {",
        *lines,
        "  }",
        "  access_strings = { for role, s in local.access_string_templates : role => replace(s, \"" + TERRAFORM_RUN
        + "\", var.run) }",
        "}",
        "",
    ])


if __name__ == "__main__":
    print(terraform_access_strings(), end="")
