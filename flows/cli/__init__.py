"""The command line: `flexmarl` and its subcommands, flags generated from the parameter models."""
