/*
 * The single-writer protocol of docs/single-writer.md as a SPIN model, checked by
 * test/model/single-writer.test.ts.
 *
 * NR replicas, each keeping durably its promised epoch, its stored replica set
 * (epoch, generation, members, rw) and the writes it holds (one bit per write).
 * NE engines: engine k is handed epoch k by the allocator (the control plane), in
 * that order (any other order is the same runs with the engines renamed). Each runs
 * Start (or, with HANDOVER, may Activate from a hand-over), then writes.
 *
 * Each call to a replica is one atomic step at that replica; an engine's fan-out
 * makes one call per step, to the replicas in any order, interleaved with the steps
 * of every other engine. Any call may fail: not delivered, or done with the reply
 * lost. An engine that is not scheduled is frozen; one never scheduled again has
 * crashed; one scheduled later resumes with what it believed before. So an old
 * engine resuming after newer ones started is among the runs explored.
 *
 * An engine decides when the last reply of a fan-out is in, and acknowledges in that
 * same step. (A reply may still reach the client later; that changes nothing here.)
 *
 * Invariants (assertions):
 *   1. One writer: when an engine acknowledges a write, every engine with a later
 *      epoch that already serves holds it on every replica of its committed rw. So
 *      no write is acknowledged behind the back of a newer engine.
 *   2. Nothing acknowledged is lost: when an engine begins to serve, its source holds
 *      every write acknowledged so far by any engine, and so does every replica of the
 *      rw it committed, as long as no newer engine has claimed one of them; and when
 *      it acknowledges, likewise for every replica of its rw.
 *   3. When an engine begins to serve (and no newer engine claimed one of its RW
 *      replicas yet), its RW replicas hold identical data.
 * An engine some RW replica of which a newer engine claimed is fenced: it learns so
 * at its next write, and acknowledges nothing more. Until then it may serve stale
 * reads, which the protocol allows (reads are not fenced), so 2 and 3 skip it.
 *
 * Options (spin -D...):
 *   NR=n NE=n WPE=n    replicas (2..4), engines, writes per engine (NE*WPE <= 15)
 *   FAULTS=n           calls that fail in one run, at most (any call, any time)
 *   HANDOVER           an engine may hand over to a later one, which activates
 *   MEMBERSHIP         the last replica starts as a spare, not a member; an engine may
 *                      rebuild a non-member and add it (members + t, rw + t), or
 *                      remove a member that is not RW (members - x): one change each
 *   FIXED_ORDER        fan-outs in replica order rather than any order (fewer runs)
 *   SETRS_ADOPTS       SetReplicaSet(c) accepted by a replica that promised less than
 *                      c.epoch (it promises c.epoch), rather than refused
 *   STRICT_ACK_ORDER   also assert that no engine acknowledges once a newer one
 *                      serves. This does not hold (see docs/single-writer.md).
 *   SALVAGE            the last engine is a salvage start (docs/salvage.md): when it
 *                      starts, the replicas in GONE (default r0) are gone for good (no
 *                      call reaches them any more, from any engine); it claims the rest,
 *                      needs no majority of C*, keeps C*.rw & claimed if not empty, else
 *                      serves from the claimed replica whose last RW set is newest, and
 *                      commits over the survivors alone; when it may lose writes (no
 *                      majority, or no replica of C*.rw) it must have claimed every
 *                      survivor, else it stops (a lost claim reply could hide the
 *                      freshest one). Asserted besides 1-3: (4) its
 *                      source holds every write acknowledged while a surviving replica
 *                      was in the committed rw (a replica may hold more, unguaranteed:
 *                      a write that reached it after it had failed); (5) when its claim
 *                      reached a majority of C*.members and a replica of C*.rw, nothing
 *                      acknowledged is missing (2 as for any start). Writes held only by gone replicas may be lost otherwise:
 *                      they are forgiven when it begins to serve, and 1-2 go on from there.
 * Deliberately broken variants, each of which must be caught:
 *   BROKEN_NO_MAJORITY a claim or commit counts as done on any one replica
 *   BROKEN_SELF_EPOCH  an engine that meets a newer epoch raises its own above it,
 *                      claims it and carries on with what it believed
 *   BROKEN_REBUILD_NO_COPY  (with MEMBERSHIP) a rebuilt replica joins rw without the
 *                      copy of the data
 *   BROKEN_ANY_SOURCE  Start takes any claimed replica as its source, not one of C*.rw
 *   GAP_EMPTY_RW       as docs/single-writer.md first had it: a RW replica that fails
 *                      leaves rw, even the last one
 *   GAP_ACTIVATE_EMPTY_RW  as docs/single-writer.md first had it: Activate does not
 *                      check that the hand-over's rw & claimed is not empty
 *   BROKEN_SALVAGE_ANY (with SALVAGE) the salvage source is any claimed replica when
 *                      none is in C*.rw, not the one whose last RW set is newest
 *   BROKEN_SALVAGE_PARTIAL  (with SALVAGE) a salvage that may lose writes goes on
 *                      without claiming every survivor
 */

#ifndef NR
#define NR 3
#endif
#ifndef NE
#define NE 3
#endif
#ifndef WPE
#define WPE 1
#endif
#ifndef FAULTS
#define FAULTS 2
#endif
#if NR < 2 || NR > 4
#error "2 to 4 replicas"
#endif

#define ALL         ((1 << NR) - 1)
#define BIT(r)      (1 << (r))
#define PC(m)       (((m) & 1) + (((m) >> 1) & 1) + (((m) >> 2) & 1) + (((m) >> 3) & 1))
#ifdef BROKEN_NO_MAJORITY
#define MAJ(got, of) (((got) & (of)) != 0)
#else
#define MAJ(got, of) (2 * PC((got) & (of)) > PC(of))
#endif
/* committed: accepted by a majority of C.members and one of T.members */
#define JOINT(ok)   (MAJ(ok, cMem) && MAJ(ok, tMem))

/* The members of a new volume: all replicas; with MEMBERSHIP, all but the last, a
 * spare that an engine may rebuild and add. */
#ifdef MEMBERSHIP
#define INIT_MEM    (ALL & ~BIT(NR - 1))
#else
#define INIT_MEM    ALL
#endif

/* SETRS_ADOPTS: SetReplicaSet(c) at a replica that promised less than c.epoch
 * promises c.epoch and stores c, rather than refusing (a proposed change) */
#ifdef SETRS_ADOPTS
#define ADOPTS      1
#else
#define ADOPTS      0
#endif

/* A call fails (never arrives, or its reply is lost): at most FAULTS in a run. */
#define FAULT       (faults < FAULTS) -> faults++

/* SALVAGE: replicas gone for good once the salvage engine started; a call to one never
 * arrives (not a fault: it does not count against FAULTS). */
#ifndef GONE
#define GONE        1
#endif
#ifdef SALVAGE
#define DOWN(r)     (gone && ((GONE >> (r)) & 1))
#else
#define DOWN(r)     false
#endif
#define SALVAGER    (SALVAGE_ON && me == NE)
#ifdef SALVAGE
#define SALVAGE_ON  1
#else
#define SALVAGE_ON  0
#endif

/* an engine raising its own epoch (BROKEN_SELF_EPOCH) stays below this */
#define MAXEP       (NE + 3)

/* The replica the next call of a fan-out goes to, among those in m. */
#ifdef FIXED_ORDER
/* engine k calls replicas in the order k, k+1, ... (mod NR): fixed, and different
 * from engine to engine */
#define PICK(m, r) \
  r = me % NR; \
  do \
  :: ((m) >> r) & 1 -> break \
  :: else -> r = (r + 1) % NR \
  od
#else
#define PICK(m, r) \
  if \
  :: ((m) & 1) -> r = 0 \
  :: ((m) & 2) -> r = 1 \
  :: ((m) & 4) -> r = 2 \
  :: ((m) & 8) -> r = 3 \
  fi
#endif

/* ---- the replicas, durable ---- */
byte promised[NR];          /* highest epoch promised */
byte sEp[NR];               /* the stored replica set: epoch, */
byte sGen[NR];              /*   generation, */
byte sMem[NR];              /*   members, */
byte sRw[NR];               /*   rw */
short data[NR];             /* the writes it holds, one bit each */
byte lrEp[NR];              /* the last set stored in which it was RW: epoch, */
byte lrGen[NR];             /*   generation */

/* ---- the control plane ---- */
byte nextEpoch = 1;         /* the volume's epoch counter (compare-and-set in the store) */
#ifdef HANDOVER
bool hoValid;               /* a hand-over {epoch, generation, members, rw} on offer */
byte hoEp; byte hoGen; byte hoMem; byte hoRw;
#endif

/* ---- what the invariants look at ---- */
byte faults;                /* calls failed so far */
bool gone;                  /* SALVAGE: the replicas in GONE are gone */
short guar[NR];             /* the writes acknowledged while it was in the committed rw */
bool salvLossy;             /* the salvage (engine NE) may lose writes */
short acked;                /* every write acknowledged so far */
byte srv;                   /* engines that began to serve (bit k: engine k), */
byte srvRw[NE + 1];         /*   and the rw each last committed */
#ifdef STRICT_ACK_ORDER
byte maxServing;            /* the newest engine that began to serve */
#endif

/* fresh = no RW replica of the committed set is promised to a newer engine (or gone:
 * SALVAGE) */
inline checkFresh() {
  fresh = true; i = 0;
  do
  :: i < NR ->
     if
     :: ((cRw >> i) & 1) && (promised[i] != E || DOWN(i)) -> fresh = false
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  i = 0
}

/* At the commit that ends Start or Activate: invariants 2 and 3, then serve. */
inline beginServing() {
  if
  :: lossy ->
     printf("MSC: salvage engine %d forgives writes %d (held by gone replicas only)\n", me, acked & ~data[src]);
     acked = acked & data[src]
  :: else -> skip
  fi;
  checkFresh();
  if
  :: fresh ->
     assert(src == 255 || (data[src] & acked) == acked);          /* 2 */
     ref = 255;
     do
     :: i < NR ->
        if
        :: (cRw >> i) & 1 ->
           assert((data[i] & acked) == acked);                    /* 2 */
           if
           :: ref == 255 -> ref = i
           :: else -> assert(data[i] == data[ref])               /* 3 */
           fi
        :: else -> skip
        fi;
        i++
     :: else -> break
     od
  :: else -> skip
  fi;
  i = 0; ref = 0; src = 0; fresh = false; lossy = false;
  serving = true;
  srv = srv | BIT(me);
#ifdef STRICT_ACK_ORDER
  if
  :: me > maxServing -> maxServing = me
  :: else -> skip
  fi;
#endif
  printf("MSC: engine %d (epoch %d) serves: set %d/%d rw %d, acknowledged so far %d\n",
         me, E, cEp, cGen, cRw, acked)
}

/* Acknowledge w: it is on every RW replica of the committed set. A write acknowledged
 * on gone replicas alone, once a salvage that may lose writes serves, is one of those
 * it lost (`lost`: not among the acknowledged writes to keep). */
inline ack() {
  assert(cRw != 0);                                                 /* 2 */
#ifdef STRICT_ACK_ORDER
  assert(me >= maxServing);
#endif
  lost = SALVAGE_ON && me < NE && ((srv >> NE) & 1) && salvLossy && (cRw & ~GONE) == 0;
  i = me + 1;
  do
  :: i <= NE ->
     if
     :: !lost && (srv >> i) & 1 ->
        ref = 0;
        do
        :: ref < NR ->
           assert(((srvRw[i] >> ref) & 1) == 0 || (data[ref] & w) != 0);   /* 1 */
           ref++
        :: else -> break
        od
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  ref = 0;
  checkFresh();
  if
  :: fresh && !lost ->
     do
     :: i < NR ->
        assert(((cRw >> i) & 1) == 0 || (data[i] & acked) == acked);    /* 2 */
        i++
     :: else -> break
     od
  :: else -> skip
  fi;
  i = 0; fresh = false;
  if
  :: lost ->
     printf("MSC: engine %d acknowledges write %d on gone replicas alone: lost\n", me, w)
  :: else ->
     do
     :: i < NR ->
        if
        :: (cRw >> i) & 1 -> guar[i] = guar[i] | w
        :: else -> skip
        fi;
        i++
     :: else -> break
     od;
     acked = acked | w;
     printf("MSC: engine %d (epoch %d) acknowledges write %d (on rw %d)\n", me, E, w, cRw)
  fi;
  i = 0; w = 0; lost = false
}

proctype Engine(byte me) {
  byte E;                   /* the epoch it holds */
  byte r; byte i; byte ref; bool fresh;   /* scratch, reset after use */
  byte todo;                /* the replicas this fan-out has still to call */
  byte ok; byte failed;     /* accepted / failed, refused or reply lost */
  byte drop;                /* RW members of T that leave it */
  byte claimed;             /* the replicas whose claim reply came back */
  byte cEp; byte cGen; byte cMem; byte cRw;   /* the committed set C (in Start: C*) */
  byte tGen; byte tMem; byte tRw;             /* the set T it moves to, at epoch E */
  byte src;                 /* Start's source (255: none, after Activate) */
  byte wdone;               /* writes issued */
  short w;                  /* the write not answered yet, 0 when none */
  bool serving;
  bool act;                 /* activating from a hand-over rather than starting */
  bool mdone;               /* made its membership change (MEMBERSHIP) */
  byte seen;                /* the epoch a refusal named */
  bool lossy;               /* SALVAGE: a salvage that may lose writes (not (5)) */
  bool lost;                /* scratch of ack() */
#ifdef HANDOVER
  byte hEp; byte hGen; byte hMem; byte hRw;   /* the hand-over it activates from */
#endif

  /* The control plane allocates the epoch. */
  atomic {
    nextEpoch == me -> E = nextEpoch; nextEpoch++;
    if
    :: SALVAGER -> gone = true; printf("MSC: replicas %d are gone; engine %d salvages\n", GONE, me)
    :: else -> skip
    fi
  };

#ifdef HANDOVER
  if
  :: atomic { hoValid -> act = true; hEp = hoEp; hGen = hoGen; hMem = hoMem; hRw = hoRw }
  :: true -> skip
  fi;
#endif

  /* ---- Start 1-2 (and Activate): claim on every member it reaches; C* = the highest set ---- */
  todo = ALL;
  do
  :: atomic {
       todo != 0 ->
       PICK(todo, r);
       todo = todo & ~BIT(r);
       if
       :: DOWN(r) -> skip
       :: else ->
       if
       :: E > promised[r] ->
          promised[r] = E;
          if
          :: claimed = claimed | BIT(r);
             printf("MSC: engine %d claims epoch %d on r%d: set %d/%d rw %d, data %d\n",
                    me, E, r, sEp[r], sGen[r], sRw[r], data[r]);
             if
             :: sEp[r] > cEp || (sEp[r] == cEp && sGen[r] > cGen) ->
                cEp = sEp[r]; cGen = sGen[r]; cMem = sMem[r]; cRw = sRw[r]
             :: else -> skip
             fi
          :: FAULT -> printf("MSC: engine %d claims epoch %d on r%d: reply lost\n", me, E, r)
          fi
       :: else ->
          if
          :: printf("MSC: engine %d: r%d refuses epoch %d\n", me, r, E);
             goto stop                                       /* STALE_EPOCH */
          :: FAULT                                           /* the refusal lost */
          fi
       :: FAULT                                              /* never arrived */
       fi
       fi;
       r = 0
     }
  :: atomic { todo == 0 -> break }
  od;

#ifdef HANDOVER
  if
  :: act ->
     /* Activate: the highest set must be the hand-over's, a majority of it claimed */
     if
     :: cEp == hEp && cGen == hGen && MAJ(claimed, hMem) -> skip
     :: else -> goto stop                                    /* STALE_EPOCH, NO_QUORUM */
     fi;
     tRw = hRw & claimed;
#ifndef GAP_ACTIVATE_EMPTY_RW
     if
     :: tRw == 0 -> goto stop                                /* no RW replica claimed */
     :: else -> skip
     fi;
#endif
     atomic {
       claimed = 0; src = 255; tGen = 1; tMem = cMem; act = false;
       hEp = 0; hGen = 0; hMem = 0; hRw = 0
     };
     goto commit                                             /* no reconcile */
  :: else -> skip
  fi;
#endif

  /* ---- Start 3: a majority of C*.members claimed, or NO_QUORUM ---- */
  if
  :: MAJ(claimed, cMem) -> skip
  :: SALVAGER && !MAJ(claimed, cMem) -> lossy = true          /* salvage: no majority needed */
  :: else -> goto stop
  fi;

  /* ---- Start 4: candidates = the claimed members of C*.rw; the source among them ---- */
#ifdef BROKEN_ANY_SOURCE
  tRw = claimed;
#else
  tRw = claimed & cRw;
#endif
#ifdef SALVAGE
  if
  :: SALVAGER && tRw == 0 && claimed != 0 ->
     /* salvage: the claimed replica whose last RW set is newest (ties: any of them) */
     atomic {
       lossy = true;
       i = 0; seen = 0; ref = 0;                   /* seen/ref: the newest (epoch, generation) */
       do
       :: i < NR ->
          if
          :: ((claimed >> i) & 1) && (lrEp[i] > seen || (lrEp[i] == seen && lrGen[i] >= ref)) ->
             seen = lrEp[i]; ref = lrGen[i]
          :: else -> skip
          fi;
          i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < NR ->
          if
#ifdef BROKEN_SALVAGE_ANY
          :: (claimed >> i) & 1 -> tRw = tRw | BIT(i)
#else
          :: ((claimed >> i) & 1) && lrEp[i] == seen && lrGen[i] == ref -> tRw = tRw | BIT(i)
#endif
          :: else -> skip
          fi;
          i++
       :: else -> break
       od;
       i = 0; seen = 0; ref = 0;
       PICK(tRw, src); tRw = BIT(src)
     }
  :: else -> skip
  fi;
#endif
  if
  :: tRw == 0 -> goto stop                                   /* NO_HEALTHY_REPLICA */
#ifndef BROKEN_SALVAGE_PARTIAL
  :: SALVAGER && lossy && claimed != (ALL & ~GONE) -> goto stop   /* must see every survivor */
#endif
  :: else -> skip
  fi;
  atomic { PICK(tRw, src); todo = tRw & ~BIT(src) };
#ifdef SALVAGE
  /* (4): the source holds every write acknowledged while a surviving replica was in the
   * committed rw (what that replica was guaranteed to hold) */
  atomic {
    if
    :: SALVAGER ->
       salvLossy = lossy;
       i = 0;
       do
       :: i < NR ->
          assert(((GONE >> i) & 1) || (guar[i] & ~data[src]) == 0);   /* 4 */
          i++
       :: else -> break
       od;
       i = 0
    :: else -> skip
    fi
  };
#endif
  claimed = 0;

  /* ---- Start 5: reconcile the other candidates from the source ---- */
  do
  :: atomic {
       todo != 0 ->
       PICK(todo, r);
       todo = todo & ~BIT(r);
       if
       :: DOWN(r) -> tRw = tRw & ~BIT(r)                      /* gone: ERR */
       :: else ->
       if
       :: promised[r] == E ->
          data[r] = data[src];
          printf("MSC: engine %d copies r%d to r%d (data %d)\n", me, src, r, data[r]);
          if
          :: skip
          :: FAULT -> tRw = tRw & ~BIT(r)                    /* reply lost: ERR */
          fi
       :: promised[r] > E ->
          if
          :: goto stop                                       /* STALE_EPOCH */
          :: FAULT -> tRw = tRw & ~BIT(r)
          fi
       :: promised[r] < E -> assert(false)                   /* a candidate was claimed */
       :: FAULT -> tRw = tRw & ~BIT(r)                       /* failed: ERR */
       fi
       fi;
       r = 0
     }
  :: atomic { todo == 0 -> break }
  od;

  /* ---- Start 6: commit (E, 1, members, rw) over C* ---- */
  tGen = 1;
  /* members: the engine's list from the control plane; with MEMBERSHIP that list may
   * lag the replica sets: it is C*.members or every replica */
#ifdef MEMBERSHIP
  if
  :: tMem = cMem
  :: tMem = ALL
  fi;
#else
  tMem = cMem;
#endif
  if
  :: SALVAGER -> tMem = ALL & ~GONE; cMem = tMem              /* commits over the survivors */
  :: else -> skip
  fi;

  /* ---- Commit T = (E, tGen, tMem, tRw) over C = (cEp, cGen, cMem, cRw) ---- */
commit:
  atomic { ok = 0; failed = 0; todo = cMem | tMem };
  do
  :: atomic {
       todo != 0 ->
       PICK(todo, r);
       todo = todo & ~BIT(r);
       if
       :: DOWN(r) -> failed = failed | BIT(r)                /* gone */
       :: else ->
       if
       :: (promised[r] == E || (ADOPTS && promised[r] < E)) &&
          (E > sEp[r] || (E == sEp[r] && (tGen > sGen[r] ||
            (tGen == sGen[r] && tMem == sMem[r] && tRw == sRw[r])))) ->
          promised[r] = E;
          sEp[r] = E; sGen[r] = tGen; sMem[r] = tMem; sRw[r] = tRw;
          if
          :: (tRw >> r) & 1 -> lrEp[r] = E; lrGen[r] = tGen   /* told: RW in it */
          :: else -> skip
          fi;
          printf("MSC: r%d stores set %d/%d rw %d of engine %d\n", r, E, tGen, tRw, me);
          if
          :: ok = ok | BIT(r)
          :: FAULT -> failed = failed | BIT(r)               /* reply lost */
          fi
       :: promised[r] > E ->
          if
          :: seen = promised[r]; goto fenced                 /* STALE_EPOCH */
          :: FAULT -> failed = failed | BIT(r)
          fi
       :: (!ADOPTS && promised[r] < E) ||
          (promised[r] == E && (E < sEp[r] || (E == sEp[r] && (tGen < sGen[r] ||
            (tGen == sGen[r] && (tMem != sMem[r] || tRw != sRw[r])))))) ->
          /* refused (not a fault): never claimed at E, or it holds a newer set */
          failed = failed | BIT(r)
       :: FAULT -> failed = failed | BIT(r)                  /* never arrived */
       fi
       fi;
       r = 0;
       /* the last reply: RW members of T that failed the call leave it (the last
        * one stays); or committed: then serve, and acknowledge what waited */
       if
       :: todo == 0 ->
          drop = failed & tRw;
#ifndef GAP_EMPTY_RW
          if
          :: drop != 0 && drop == tRw -> PICK(drop, r); drop = drop & ~BIT(r); r = 0
          :: else -> skip
          fi
#endif
       :: else -> skip
       fi;
       if
       :: todo == 0 && drop == 0 && JOINT(ok) ->
          cEp = E; cGen = tGen; cMem = tMem; cRw = tRw;
          srvRw[me] = cRw;
          if
          :: !serving -> beginServing()
          :: else -> skip
          fi;
          if
          :: w != 0 -> ack()
          :: else -> skip
          fi;
          ok = 0; failed = 0;
          goto serve
       :: else -> skip
       fi
     }
  :: atomic { todo == 0 -> break }
  od;
  /* not committed */
  if
  :: drop != 0 ->
     /* try again without them, with a new generation */
     atomic { tRw = tRw & ~drop; tGen++; ok = 0; failed = 0; drop = 0; goto commit }
  :: else ->
     /* no majority: hold and try again, or fail the request (EIO) and go on */
     ok = 0; failed = 0;
     if
     :: goto commit
     :: serving -> w = 0; goto serve
     fi
  fi;

  /* ---- Running ---- */
serve:
  do
  :: wdone < WPE ->
     atomic {
       w = 1 << ((me - 1) * WPE + wdone);
       wdone++;
       todo = tRw; ok = 0; failed = 0
     };
     goto write
#ifdef HANDOVER
  :: atomic {
       /* Deactivate, drained and committed: hand over {epoch, generation, members, rw}
        * (any engine that believes it serves may, even one already fenced), and stop */
       cEp == E && cGen == tGen ->
       hoValid = true; hoEp = cEp; hoGen = cGen; hoMem = cMem; hoRw = cRw;
       printf("MSC: engine %d hands over set %d/%d rw %d\n", me, cEp, cGen, cRw)
     };
     goto stop
#endif
#ifdef MEMBERSHIP
  /* Membership changes, one per engine, from a committed set. */
  :: atomic {
       cEp == E && cGen == tGen && !mdone && (cMem & ~cRw) != 0 ->
       /* remove a member that is not RW */
       mdone = true;
       PICK(cMem & ~cRw, r);
       tMem = cMem & ~BIT(r); tGen++;
       printf("MSC: engine %d removes r%d\n", me, r);
       r = 0
     };
     goto commit
  :: atomic {
       cEp == E && cGen == tGen && !mdone && (ALL & ~cMem) != 0 ->
       /* rebuild a replica that is not a member from a RW one (AdoptChain at E, then
        * the copy; I/O is quiesced), then commit it as a RW member */
       mdone = true;
       PICK(ALL & ~cMem, r);
       PICK(cRw, src);
       if
       :: E >= promised[r] ->
          promised[r] = E;
#ifndef BROKEN_REBUILD_NO_COPY
          data[r] = data[src];
#endif
          printf("MSC: engine %d rebuilds r%d from r%d (data %d)\n", me, r, src, data[r]);
          if
          :: tMem = cMem | BIT(r); tRw = cRw | BIT(r); tGen++
          :: FAULT                                           /* reply lost: given up */
          fi
       :: E < promised[r] ->
          if
          :: seen = promised[r]; goto fenced                 /* STALE_EPOCH */
          :: FAULT
          fi
       :: FAULT                                              /* failed: given up */
       fi;
       r = 0; src = 0
     };
     if
     :: cGen == tGen -> skip
     :: else -> goto commit
     fi
#endif
  :: goto stop                                               /* closed, or crashed */
  od;

  /* A write goes to every RW replica of T; it is acknowledged once all have it and T
   * is committed. Those that fail leave T, which must then be committed. */
write:
  do
  :: atomic {
       todo != 0 ->
       PICK(todo, r);
       todo = todo & ~BIT(r);
       if
       :: DOWN(r) -> failed = failed | BIT(r)                /* gone */
       :: else ->
       if
       :: promised[r] == E ->
          data[r] = data[r] | w;
          printf("MSC: engine %d writes %d to r%d\n", me, w, r);
          if
          :: skip
          :: FAULT -> failed = failed | BIT(r)               /* reply lost */
          fi
       :: promised[r] > E ->
          if
          :: seen = promised[r]; goto fenced                 /* STALE_EPOCH */
          :: FAULT -> failed = failed | BIT(r)
          fi
       :: promised[r] < E -> assert(false)                   /* a RW replica was claimed */
       :: FAULT -> failed = failed | BIT(r)                  /* never arrived */
       fi
       fi;
       r = 0;
       if
       :: todo == 0 && failed == 0 && cEp == E && cGen == tGen -> ack(); goto serve
       :: else -> skip
       fi
     }
  :: atomic { todo == 0 -> break }
  od;
  if
  :: failed != 0 ->
     /* those that failed leave T; not the last one: then the write fails (EIO) */
     atomic {
       drop = failed;
#ifndef GAP_EMPTY_RW
       if
       :: drop == tRw -> PICK(drop, r); drop = drop & ~BIT(r); r = 0; w = 0
       :: else -> skip
       fi;
#endif
       if
       :: drop != 0 -> tRw = tRw & ~drop; tGen++
       :: else -> skip
       fi;
       failed = 0; drop = 0;
       if
       :: w == 0 && cEp == E && cGen == tGen -> goto serve
       :: else -> goto commit
       fi
     }
  :: else -> goto commit                                     /* T waits for its commit */
  fi;

fenced:
#ifdef BROKEN_SELF_EPOCH
  /* Broken: raise its own epoch above the one it met, claim it, carry on. */
  if
  :: serving && seen + 1 < MAXEP ->
     atomic {
       E = seen + 1; claimed = 0; todo = cMem; seen = 0;
       printf("MSC: engine %d raises its own epoch to %d\n", me, E)
     };
     do
     :: atomic {
          todo != 0 ->
          PICK(todo, r);
          todo = todo & ~BIT(r);
          if
          :: E > promised[r] -> promised[r] = E; claimed = claimed | BIT(r)
          :: else -> skip
          fi;
          r = 0
        }
     :: atomic { todo == 0 -> break }
     od;
     if
     :: MAJ(claimed, cMem) && (tRw & claimed) != 0 ->
        atomic { tRw = tRw & claimed; tGen = 1; claimed = 0; ok = 0; failed = 0 };
        if
        :: w != 0 -> todo = tRw; goto write                  /* send the write again */
        :: else -> goto commit
        fi
     :: else -> skip
     fi
  :: else -> skip
  fi;
#endif
  skip;

stop:
  skip;
  /* forget everything: engines that stopped in different ways are one state */
  d_step {
    E = 0; r = 0; i = 0; ref = 0; fresh = false; todo = 0; ok = 0; failed = 0;
    claimed = 0; drop = 0; cEp = 0; cGen = 0; cMem = 0; cRw = 0; tGen = 0; tMem = 0; tRw = 0;
    src = 0; wdone = 0; w = 0; serving = false; act = false; mdone = false; seen = 0; lossy = false;
#ifdef HANDOVER
    hEp = 0; hGen = 0; hMem = 0; hRw = 0
#endif
  }
}

init {
  byte r;
  d_step {
    /* a new volume: every replica holds the set (0, 1, all, all) and no data */
    r = 0;
    do
    :: r < NR && (INIT_MEM >> r) & 1 -> sGen[r] = 1; sMem[r] = INIT_MEM; sRw[r] = INIT_MEM; lrGen[r] = 1; r++
    :: r < NR && !((INIT_MEM >> r) & 1) -> r++       /* a spare: no replica set */
    :: else -> break
    od;
    r = 0
  };
  atomic {
    r = 1;
    do
    :: r <= NE -> run Engine(r); r++
    :: else -> break
    od;
    r = 0
  }
}
