{
  "targets": [
    {
      "target_name": "mooring",
      "sources": ["<!@(ls -1 native/src/*/*.cc)"],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native/src"
      ],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_DEPRECATED",
        "MOORING_VERSION=\"<!(node -p \"require('./package.json').version\")\""
      ],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "libraries": ["-ldl", "-lpthread"]
    }
  ]
}
