from specpolicy.cli import main

main()
