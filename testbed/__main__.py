from testbed.cli.main import entry

entry()
