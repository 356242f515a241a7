from aurora_store.cli import main

raise SystemExit(main())
