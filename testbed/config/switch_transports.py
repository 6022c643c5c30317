"""The transports of a switch's other management interfaces: TL1 over TCP and NETCONF over SSH. Passwords
never go in the YAML: the inventory names the environment variable that holds one (`password_env`), read when
the run starts, in the runner's process, and never written to a run's files.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field

from testbed.config.transports import Endpoint, TransportConfig
from testbed.contracts.errors import UserError

# What the twin's switches accept, and where the framework finds it in an emulated run (testbed/twin/bridge.py sets it).
TWIN_PASSWORD_ENV = "TESTBED_TWIN_PASSWORD"  # noqa: S105 (the name of a variable)


def _password(env: str | None, what: str) -> str | None:
    if env is None:
        return None
    value = os.environ.get(env)
    if value is None:
        raise UserError(
            f"{what}: the password is read from the environment variable {env}, which is not set; "
            f"export {env}=... in the shell that runs testbed (or change password_env in the inventory)"
        )
    return value


class Tl1Transport(TransportConfig):
    type: Literal["tl1"]
    host: str
    port: int = Field(3082, ge=1, le=65535, description="the TL1 agent's TCP port (Polatis 3082, Calient 3083)")
    user: str
    password_env: str = Field(
        description="environment variable holding the TL1 password (ACT-USER); never put the password here"
    )
    timeout_ms: int = Field(5000, gt=0, le=600_000)

    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def endpoint(self) -> Endpoint:
        return Endpoint("tl1", self.host, str(self.port))

    def settings(self):
        from drivers.transports.tl1_settings import Tl1Settings

        password = _password(self.password_env, f"TL1 login to {self.address()}")
        return Tl1Settings(self.host, self.port, self.user, password, self.password_env, self.timeout_ms / 1000)

    def at_twin(self, endpoint: dict) -> Tl1Transport:
        host, _, port = endpoint["tl1"].rpartition(":")
        return self.model_copy(update={"host": host, "port": int(port), "password_env": TWIN_PASSWORD_ENV})


class NetconfTransport(TransportConfig):
    type: Literal["netconf"]
    host: str
    port: int = Field(830, ge=1, le=65535)
    user: str
    key_file: str | None = Field(None, description="private key; omit to use password_env or the SSH agent")
    password_env: str | None = Field(None, description="environment variable holding the password, if any")
    known_hosts: str | None = Field(None, description="known_hosts file; default ~/.ssh/known_hosts")
    timeout_ms: int = Field(10000, gt=0, le=600_000)

    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def endpoint(self) -> Endpoint:
        return Endpoint("netconf", self.host, str(self.port))

    def settings(self):
        from drivers.netconf.settings import NetconfSettings

        password = _password(self.password_env, f"NETCONF login to {self.address()}")
        return NetconfSettings(
            self.host,
            self.port,
            self.user,
            self.key_file,
            password,
            self.password_env,
            self.known_hosts,
            self.timeout_ms / 1000,
        )

    def at_twin(self, endpoint: dict) -> NetconfTransport:
        host, _, port = endpoint["netconf"].rpartition(":")
        update = {
            "host": host,
            "port": int(port),
            "known_hosts": endpoint["known_hosts"],
            "key_file": endpoint["key_file"],
            "password_env": None,
        }
        return self.model_copy(update=update)
