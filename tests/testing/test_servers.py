"""The local servers the demo and the tests start: a port chosen for a server can be taken by someone else
before the server binds it (ports come from ``bind(0)``, the same pool outgoing connections draw from).
Such a server is started again on fresh ports; one given a port by its caller is not moved."""

from __future__ import annotations

import os
import socket
import time

import boto3
import pytest
import redis

from aurora_store.errors import ServerExitedError, ServiceError
from aurora_store.testing import servers as localservices
from aurora_store.testing.servers import RedisServer, S3Server

pytestmark = [pytest.mark.redis, pytest.mark.s3]


def occupy(port: int) -> socket.socket:
    """Hold ``port`` the way a racing process would: bound (so a server's bind fails), not listening (so a
    readiness probe can't mistake it for the server)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    return holder


def test_redis_whose_chosen_port_was_taken_starts_on_another():
    server = RedisServer()
    taken = server.port
    with occupy(taken), server.start():
        assert server.port != taken
        assert redis.Redis.from_url(server.url).ping()


def test_redis_on_a_callers_taken_port_fails_with_a_typed_error_and_leaves_nothing_running():
    with occupy(0) as holder:
        port = holder.getsockname()[1]
        server = RedisServer(port=port)
        with pytest.raises(ServerExitedError, match=str(port)) as caught:
            server.start()
        assert isinstance(caught.value, ServiceError)
        assert server.port == port and server.process is None


def serving_pid(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


class SlowToDie:
    """A server process that, as on a loaded machine, is still seen alive for a while after its failed bind: the
    readiness probe then reaches whoever else listens on the port before it sees the exit."""

    def __init__(self, process, alive_s: float = 1.0) -> None:
        self._process, self._until = process, time.monotonic() + alive_s

    def poll(self):
        return None if time.monotonic() < self._until else self._process.poll()

    def __getattr__(self, name):
        return getattr(self._process, name)


def test_redis_whose_chosen_port_another_server_listens_on_starts_on_another_and_is_its_own(monkeypatch):
    """Two clusters of a parallel run may choose the same free port: the second's server cannot bind it and
    exits, while the first answers there. The readiness probe must not take the first for the second."""
    with RedisServer().start() as first:
        second = RedisServer()
        second.port = first.port  # the race, forced: chosen here, so it may move
        real_popen = RedisServer._popen
        monkeypatch.setattr(RedisServer, "_popen", lambda self, *a, **kw: SlowToDie(real_popen(self, *a, **kw)))
        with second.start():
            assert second.port != first.port
            assert serving_pid(second) == second.process.pid != serving_pid(first) == first.process.pid


def test_redis_on_a_callers_port_another_server_listens_on_fails_with_a_typed_error():
    with RedisServer().start() as first:
        server = RedisServer(port=first.port)
        with pytest.raises(ServerExitedError, match="another process listens there"):
            server.start()
        assert server.process is None and serving_pid(first) == first.process.pid


def test_listens_tells_the_listening_process_from_another():
    with occupy(0) as holder:
        holder.listen()
        port = holder.getsockname()[1]
        assert localservices.listens(os.getpid(), port) is True
        with RedisServer().start() as other:
            assert localservices.listens(other.process.pid, port) is False
            assert localservices.listens(other.process.pid, other.port) is True


def first_choice_is(taken: int, monkeypatch) -> list[list[int]]:
    """Make the first choice of ports for a server start with ``taken`` (the race itself can't be forced);
    returns the list of every choice made."""
    real, choices = localservices.free_ports, []

    def first_choice_taken(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = real(count, host)
        if not choices:
            ports[0] = taken
        choices.append(ports)
        return ports

    monkeypatch.setattr(localservices, "free_ports", first_choice_taken)
    return choices


def assert_serves_s3(server: S3Server) -> None:
    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
                          aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
    assert "Buckets" in client.list_buckets()


def test_a_closed_port_refuses_connections_and_cannot_be_taken_while_held():
    with localservices.closed_port() as port:
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with socket.socket() as racer, pytest.raises(OSError, match="in use"):
            racer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            racer.bind(("127.0.0.1", port))
    with socket.socket() as later:  # released once the block ends
        later.bind(("127.0.0.1", port))


def test_s3_whose_chosen_port_was_taken_starts_on_fresh_ports(monkeypatch):
    holder = occupy(0)
    taken = holder.getsockname()[1]
    choices = first_choice_is(taken, monkeypatch)
    with holder, S3Server().start() as server:
        assert len(choices) == 2 and server.port == choices[1][0] != taken
        assert_serves_s3(server)


def test_s3_whose_port_a_passing_listener_held_starts_on_fresh_ports(monkeypatch):
    """Seen beside a parallel test pass: someone else listened on the S3 port for a moment. The port check
    connected to that listener, SeaweedFS exited as it could not bind the port, and the readiness probe then
    polled a closed port for its whole minute. The probe watches the process: the server moves at once."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    taken = listener.getsockname()[1]
    choices = first_choice_is(taken, monkeypatch)
    real_ready = localservices.s3_wait_ready

    def listener_gone_before_the_probe(*args, process, **kwargs) -> None:
        if not choices[1:]:  # the first launch: SeaweedFS exits (the port is held), then the listener leaves
            process.wait(timeout=30)
            listener.close()
        return real_ready(*args, process=process, **kwargs)

    monkeypatch.setattr(localservices, "s3_wait_ready", listener_gone_before_the_probe)
    started = time.monotonic()
    with S3Server().start() as server:
        assert len(choices) == 2 and server.port == choices[1][0] != taken
        assert time.monotonic() - started < 30, "moved when the server exited, not after the probe's minute"
        assert_serves_s3(server)


def test_a_server_that_keeps_dying_gives_up_after_a_bounded_number_of_attempts(monkeypatch):
    holder = occupy(0)
    taken = holder.getsockname()[1]
    chosen = []

    def always_the_taken_port(self) -> None:
        chosen.append(taken)
        self.port = taken

    monkeypatch.setattr(RedisServer, "_choose_ports", always_the_taken_port)
    server = RedisServer()
    with holder, pytest.raises(ServerExitedError):
        server.start()
    assert len(chosen) == localservices.START_ATTEMPTS and server.process is None
    server.stop()


def test_an_s3_server_gone_mid_session_says_how_with_its_log():
    server = S3Server().start()
    try:
        server.create_bucket("before")
        server.process.kill()
        server.process.wait(10)
        with pytest.raises(ServerExitedError, match="exited with code -9 while in use") as caught:
            server.create_bucket("after")
        assert "SeaweedFS" in str(caught.value)  # the end of weed's own log comes with it
        assert isinstance(caught.value, ServiceError)
    finally:
        server.stop()
