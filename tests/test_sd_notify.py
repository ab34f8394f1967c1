import os
import socket

from daemon.sd_notify import Notifier, listen_fds, watchdog_interval


def test_notifier_sends_datagrams_in_order(tmp_path):
    path = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("serving 2 models on 1 device")
    assert n.watchdog()
    assert n.stopping()
    got = [server.recv(4096).decode() for _ in range(3)]
    assert got == ["READY=1\nSTATUS=serving 2 models on 1 device", "WATCHDOG=1",
                   "STOPPING=1\nSTATUS=stopping"]
    n.close()
    server.close()


def test_abstract_socket_and_absent_socket():
    name = f"vkserve-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    n = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert n.status("loading")
    assert server.recv(100) == b"STATUS=loading"
    assert not Notifier({}).enabled and not Notifier({}).ready("x")


def test_watchdog_interval():
    assert watchdog_interval({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "4000000",
                              "WATCHDOG_PID": str(os.getpid())}) == 2.0
    assert watchdog_interval({}) is None


def test_listen_fds_only_for_our_pid():
    assert listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) == []
    assert listen_fds({}) == []
