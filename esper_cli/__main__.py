from esper_cli.main import main

raise SystemExit(main())
