from builder.cli import main

raise SystemExit(main())
