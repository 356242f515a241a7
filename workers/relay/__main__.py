from workers.relay.relay import main

raise SystemExit(main())
