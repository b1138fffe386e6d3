from scalingnote.cli import main

main()
