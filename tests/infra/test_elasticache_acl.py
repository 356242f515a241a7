"""The ElastiCache access strings (`aurora_store.bus.acl.access_string`, which `infra/terraform/modules/aws-redis`
carries) against a real Valkey: a user made the way ElastiCache makes one — its password set apart, then the access
string's rules — has exactly the permissions `acl.rules` gives the local cluster's users, and behaves like them."""

from __future__ import annotations

import secrets

import pytest

from aurora_store.bus import acl
from aurora_store.bus.redis_keys import RunKeys

pytestmark = pytest.mark.redis
redis = pytest.importorskip("redis")

RUN = "demo"


def _user(client, name: str, password: str, rules: list[str]) -> dict:
    client.execute_command("ACL", "SETUSER", name, f">{password}", *rules)
    user = client.acl_getuser(name)
    user.pop("passwords")
    return user


@pytest.mark.parametrize("role", acl.ROLES)
def test_access_string_grants_what_the_acl_rules_grant(redis_server, role):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    names = (f"elasticache-{role}", f"reference-{role}")
    try:
        elasticache = _user(client, names[0], secrets.token_hex(16), acl.access_string(role, RUN).split())
        reference = _user(client, names[1], secrets.token_hex(16), ["reset", "on", *acl.rules(role, RUN)])
        assert elasticache == reference
        assert acl.access_string(role, RUN).startswith("on ")  # ElastiCache leaves a user without `on` off
    finally:
        client.execute_command("ACL", "DELUSER", *names)
        client.close()


def test_actor_access_string_writes_but_never_reads_other_actors(redis_server):
    operator = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = RunKeys(RUN)
    password = secrets.token_hex(16)
    operator.execute_command("ACL", "SETUSER", "elasticache-actor", f">{password}",
                             *acl.access_string("actor", RUN).split())
    actor = redis.Redis.from_url(acl.role_url(redis_server.url, "elasticache-actor", password), decode_responses=True)
    try:
        actor.hset(keys.actor("a1"), mapping={"region": "eu-west-1"})  # its own registration: write-only
        with pytest.raises(redis.exceptions.NoPermissionError):
            actor.hgetall(keys.actor("a2"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            actor.hset(keys.trainer, mapping={"state": "forged"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            actor.hset(RunKeys("other").actor("a1"), mapping={"region": "eu-west-1"})  # another run's keys
    finally:
        actor.close()
        operator.delete(keys.actor("a1"))
        operator.execute_command("ACL", "DELUSER", "elasticache-actor")
        operator.close()
