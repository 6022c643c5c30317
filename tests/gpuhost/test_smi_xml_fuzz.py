"""Property tests of the `nvidia-smi -q -x` reader (drivers/gpuhost/smi_xml.py): whatever a host prints, garbled
or hostile, the reader returns typed readings or raises BadReply for a DeviceProtocolError with a hint, never
another exception; a report that declares entities is refused, never expanded.

Inputs: arbitrary text, the real H200 report (fixtures/h200-nvidia-smi-q.xml) cut, spliced and with any field's
text replaced, and DOCTYPEs declaring entities.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drivers.errors import DeviceProtocolError
from drivers.gpuhost.reply import BadReply
from drivers.gpuhost.smi_xml import SmiReport, read_report

REAL = (Path(__file__).parent / "fixtures" / "h200-nvidia-smi-q.xml").read_text()
HEADER = REAL[: REAL.index("<nvidia_smi_log>")]
FIELDS = [
    el.tag for el in ET.fromstring(REAL[len(HEADER) :]).find("gpu").iter() if el.text and el.text.strip()
]  # the GPU's leaves
NASTY = ["", "N/A", "Yes", "No", "Active", "-1", "1e400", "9" * 40, "١٢", "0x10", "12 C C", "\x00", "]]>", "&amp;"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read(text: str) -> SmiReport | None:
    """The reader's answer: a report, or None when it raised the driver's error; anything else fails the test."""
    try:
        return read_report(text)
    except BadReply as bad:
        assert bad.error is DeviceProtocolError and bad.message and bad.hint
        return None


@FUZZ
@given(st.text(max_size=400))
@example("<?xml version='1.0' encoding='UTF-16'?><nvidia_smi_log/>")  # an encoding a str cannot be in
@example("<nvidia_smi_log>" * 3000)
@example("\ufeff<?xml version='1.0'?><nvidia_smi_log/>")
def test_any_text_is_a_report_or_the_drivers_error(text):
    read(text)


@FUZZ
@given(st.integers(0, len(REAL)), st.integers(0, len(REAL)), st.text(max_size=40))
def test_the_real_report_cut_and_spliced_is_a_report_or_the_drivers_error(start, end, insert):
    read(REAL[:start] + insert + REAL[max(start, end) :])


@FUZZ
@given(st.data())
def test_any_field_holding_anything_is_a_report_or_the_drivers_error(data):
    root = ET.fromstring(REAL[len(HEADER) :])
    gpu = root.find("gpu")
    for _ in range(data.draw(st.integers(1, 4))):
        tag = data.draw(st.sampled_from(FIELDS))
        el = next(e for e in gpu.iter() if e.tag == tag)
        el.text = data.draw(st.sampled_from(NASTY) | st.text(max_size=12))
    text = HEADER + ET.tostring(root, encoding="unicode")
    report = read(text)
    if report is not None:
        (reading,) = report.gpus
        reading.conditions()  # every reading a health check takes is well typed enough to judge


@FUZZ
@given(
    st.sampled_from(["x", "lol", "a"]),
    st.sampled_from(['"boom"', 'SYSTEM "file:///etc/passwd"', 'SYSTEM "http://127.0.0.1:9/x"', '"&lol;&lol;"']),
    st.booleans(),
)
def test_a_report_declaring_entities_is_refused(name, value, used):
    body = f"<driver_version>&{name};</driver_version>" if used else ""
    doctype = f"<!DOCTYPE nvidia_smi_log [<!ENTITY {name} {value}>]>"
    text = f'<?xml version="1.0" ?>\n{doctype}\n<nvidia_smi_log>{body}</nvidia_smi_log>'
    assert read(text) is None
