from workers.actor.actor import main

if __name__ == "__main__":  # vLLM's engine spawns processes that re-import this module
    raise SystemExit(main())
