{
  "targets": [
    {
      "target_name": "handoff_native",
      "sources": ["scatter_read.c"],
      "cflags": ["-O2", "-Wall", "-Wextra"]
    }
  ]
}
