from dyncli.cli import main

main()
