// The `sanlock` object of the addon (NativeSanlock in src/native/binding.ts): sanlock's
// client API, one JS function per C call, over the dlopen'ed SanlockLibrary.
//
// Calls that talk to the daemon run in an async worker and resolve with `{ rv, ... }`,
// sanlock's own return value (0 or positive: success; <= -200: a sanlock_rv.h error; other
// negatives: -errno). The TypeScript layer (src/locks/sanlock-client.ts) turns rv into a
// MooringError; the binding rejects only for bad arguments (INVALID_ARGUMENT) and when the
// library is missing (UNSUPPORTED, naming the package to install). Calls on one registered
// connection are serialised; local string helpers are synchronous.
#pragma once

#include <napi.h>

namespace mooring {

Napi::Object CreateSanlockBinding(Napi::Env env);

}  // namespace mooring
