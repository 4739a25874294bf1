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
      "libraries": ["-ldl", "-lpthread"],
      "ldflags": ["-static-libstdc++", "-static-libgcc"],
      "conditions": [
        ["target_arch=='x64' or target_arch=='arm64'", {
          "ldflags": ["-Wl,--wrap=pthread_rwlock_init", "-Wl,--wrap=pthread_rwlock_destroy", "-Wl,--wrap=pthread_rwlock_rdlock", "-Wl,--wrap=pthread_rwlock_wrlock", "-Wl,--wrap=pthread_rwlock_tryrdlock", "-Wl,--wrap=pthread_rwlock_trywrlock", "-Wl,--wrap=pthread_rwlock_unlock", "-Wl,--wrap=pthread_rwlockattr_init", "-Wl,--wrap=pthread_rwlockattr_destroy", "-Wl,--wrap=pthread_rwlockattr_setkind_np", "-Wl,--wrap=pthread_once", "-Wl,--wrap=dlopen", "-Wl,--wrap=dlsym", "-Wl,--wrap=dlerror", "-Wl,--wrap=dlclose", "-Wl,--wrap=stat64", "-Wl,--wrap=lstat64", "-Wl,--wrap=fstat64", "-Wl,--wrap=pthread_cond_clockwait", "-Wl,--wrap=pthread_create", "-Wl,--wrap=pthread_join", "-Wl,--wrap=pthread_detach", "-Wl,--wrap=pthread_key_create", "-Wl,--wrap=__pthread_key_create", "-Wl,--wrap=pthread_key_delete", "-Wl,--wrap=pthread_getspecific", "-Wl,--wrap=pthread_setspecific", "-Wl,--wrap=arc4random", "-Wl,--wrap=_dl_find_object"]
        }],
        ["target_arch=='arm64'", {
          "ldflags": ["-Wl,--wrap=fcntl64", "-Wl,--wrap=getentropy"]
        }]
      ]
    }
  ]
}
