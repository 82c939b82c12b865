from dyntc.cli import main

main()
