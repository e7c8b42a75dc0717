from bench.relay.runner import main

main()
