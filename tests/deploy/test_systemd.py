import os
import socket

from vkserve.daemon.systemd import listen_fds, notify, watchdog_interval


def test_notify_sends_datagrams_in_order(tmp_path):
    path = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    env = {"NOTIFY_SOCKET": path}
    assert notify("READY=1\nSTATUS=serving", env)
    assert notify("WATCHDOG=1", env)
    assert notify("STOPPING=1", env)
    assert [server.recv(4096) for _ in range(3)] == [b"READY=1\nSTATUS=serving", b"WATCHDOG=1",
                                                     b"STOPPING=1"]
    server.close()


def test_abstract_socket_and_absent_socket():
    name = f"vkserve-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    assert notify("STATUS=loading", {"NOTIFY_SOCKET": "@" + name})
    assert server.recv(100) == b"STATUS=loading"
    assert not notify("READY=1", {})
    assert not notify("READY=1", {"NOTIFY_SOCKET": "relative/path"})


def test_watchdog_interval():
    assert watchdog_interval({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "4000000",
                              "WATCHDOG_PID": str(os.getpid())}) == 2.0
    assert watchdog_interval({}) is None


def test_listen_fds_only_for_our_pid():
    assert listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) == []
    assert listen_fds({}) == []
