from specpolicy.run.cli import main

main()
