from workers.trainer.trainer import main

raise SystemExit(main())
