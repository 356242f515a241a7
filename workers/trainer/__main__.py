import sys

if "--plan-memory" in sys.argv[1:]:  # arithmetic only: skip importing the trainer's processes and stores
    from workers.trainer.memory import run_cli

    raise SystemExit(run_cli(sys.argv[1:]))

from workers.trainer.trainer import main

raise SystemExit(main())
