from bench.sim.cli import main

main()
