from hppctl.cli import main

main()
