"""The switch's other management interfaces as the inventory names them (TL1, NETCONF): passwords only from the
environment, the twin's published password handed over through the variable the framework and the emulators
agree on, and the twin serving the interface the driver speaks.
"""

from __future__ import annotations

import pytest

from emulators import frontends
from testbed.config import switch_transports
from testbed.config.switch_transports import NetconfTransport, Tl1Transport
from testbed.contracts.errors import UserError


def test_the_twin_password_variable_is_one_name_on_both_sides():
    assert switch_transports.TWIN_PASSWORD_ENV == frontends.TWIN_PASSWORD_ENV


def test_a_tl1_password_comes_from_the_environment_and_is_never_shown(monkeypatch):
    t = Tl1Transport(type="tl1", host="10.0.0.5", user="admin", password_env="LAB_TL1_PW")
    monkeypatch.delenv("LAB_TL1_PW", raising=False)
    with pytest.raises(UserError, match="LAB_TL1_PW, which is not set; export LAB_TL1_PW="):
        t.settings()
    monkeypatch.setenv("LAB_TL1_PW", "s3cret")
    settings = t.settings()
    assert settings.password == "s3cret" and "s3cret" not in repr(settings)
    assert "s3cret" not in t.model_dump_json()  # the inventory (and so run.json) holds the variable's name only
    twin = t.at_twin({"tl1": "127.0.0.1:4000"})
    assert (twin.host, twin.port, twin.password_env) == ("127.0.0.1", 4000, frontends.TWIN_PASSWORD_ENV)


def test_netconf_at_the_twin_uses_its_key_and_host_key():
    t = NetconfTransport(type="netconf", host="10.0.0.5", user="admin", password_env="LAB_NC_PW")
    twin = t.at_twin({"netconf": "127.0.0.1:4830", "known_hosts": "/tmp/kh", "key_file": "/tmp/k"})
    assert (twin.port, twin.known_hosts, twin.key_file, twin.password_env) == (4830, "/tmp/kh", "/tmp/k", None)
    assert twin.address() == "admin@127.0.0.1:4830"
