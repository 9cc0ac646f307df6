"""Private Redis topologies on loopback for tests: a Cluster (masters with replicas) and a
Sentinel-watched master with a replica. Every process is started on a free port and
stopped by its PID."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from conftest import RedisServer, free_cluster_port, free_port
from helpers import wait_until

NODE_TIMEOUT_MS = 1000
"""How long a Cluster node or a Sentinel waits before it takes a master for dead."""


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=1)


class LocalCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each."""

    def __init__(self, directory: Path, masters: int = 3, replicas: int = 1) -> None:
        self.masters, self.replicas = masters, replicas
        args = (
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--appendonly",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        )
        self.servers: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            node_dir = directory / f"node{i}"
            node_dir.mkdir()
            log = ("--logfile", str(node_dir / "redis.log"))
            self.servers.append(RedisServer(node_dir, *args, *log, pick_port=free_cluster_port))

    @property
    def url(self) -> str:
        live = [s for s in self.servers if s.process is not None]
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in live)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (.ci/run installs redis)")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{s.port}" for s in self.servers),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=60,
        )
        wait_until("the cluster is formed, every replica in sync", self.healthy)

    def healthy(self) -> bool:
        """Every live node says the cluster is ok, every live replica is in sync with its
        master, and the masters serving slots are all there."""
        for server in self.servers:
            if server.process is None:
                continue
            with _client(server.port) as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                replication = client.info("replication")
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
        return len(self.master_ports()) == self.masters

    def master_ports(self) -> list[int]:
        """The ports of the live masters that own slots."""
        ports = []
        for server in self.servers:
            if server.process is None:
                continue
            with _client(server.port) as client:
                role = client.execute_command("ROLE")
                if role[0] in (b"master", "master") and self._owns_slots(client):
                    ports.append(server.port)
        return ports

    @staticmethod
    def _owns_slots(client: redis.Redis) -> bool:
        nodes = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        myself = [line.split() for line in nodes if "myself" in line]
        return bool(myself) and len(myself[0]) > 8  # slot ranges follow the 8 fields

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def port_of_slot(self, slot: int) -> int:
        """The port of the live master that serves ``slot``."""
        with _client(self.master_ports()[0]) as client:
            for start, end, master, *_replicas in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise RuntimeError(f"no live master serves slot {slot}")

    def move_slot(self, slot: int, to_port: int, batch: int = 5, pause_s: float = 0.05) -> int:
        """Move ``slot`` and its keys to the master at ``to_port`` the way resharding does
        (``MIGRATING``/``IMPORTING``, then ``MIGRATE`` in batches, so that clients meet
        ``ASK`` meanwhile and ``MOVED`` after); the number of keys moved."""
        from_port = self.port_of_slot(slot)
        with _client(from_port) as source, _client(to_port) as target:
            source_id, target_id = (
                c.execute_command("CLUSTER", "MYID").decode() for c in (source, target)
            )
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            moved = 0
            while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause_s)
            for port in self.master_ports():
                with _client(port) as master:
                    master.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def stop(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.kill()


class LocalSentinel:
    """A master, one replica, and three Sentinels watching them as ``master_name``."""

    def __init__(self, directory: Path, master_name: str = "toolnexus") -> None:
        self.master_name = master_name
        self.directory = directory
        self.master = RedisServer(directory / "master")
        self.replica = RedisServer(directory / "replica")
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        addresses = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{addresses}/{self.master_name}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        for server in (self.master, self.replica):
            server.directory.mkdir()
        self.master.start()
        self.replica.args = ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        wait_until("the replica is in sync", self._replica_in_sync)
        for port in self.sentinel_ports:
            config = self.directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {NODE_TIMEOUT_MS}\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
            )
            self.sentinels.append(
                subprocess.Popen([binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL)
            )
        wait_until("the sentinels see the replica and each other", self._sentinels_ready)

    def _replica_in_sync(self) -> bool:
        with _client(self.replica.port) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def _sentinels_ready(self) -> bool:
        for port in self.sentinel_ports:
            with _client(port) as client:
                master = client.sentinel_master(self.master_name)
                if int(master["num-slaves"]) < 1 or int(master["num-other-sentinels"]) < 2:
                    return False
        return True

    def master_port(self) -> int:
        """The master's port as the first Sentinel reports it."""
        with _client(self.sentinel_ports[0]) as client:
            _host, port = client.sentinel_get_master_addr_by_name(self.master_name)
            return int(port)

    def stop(self) -> None:
        for process in self.sentinels:
            with contextlib.suppress(Exception):
                process.kill()
                process.wait(10)
        self.sentinels.clear()
        for server in (self.master, self.replica):
            with contextlib.suppress(Exception):
                server.kill()
