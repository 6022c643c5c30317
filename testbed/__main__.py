from testbed.cli import entry

entry()
