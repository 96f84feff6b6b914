/* CTC prefix beam search on stored per-frame top-k posteriors, in C; and CTC's forward score of
 * given label sequences (``ctc_forward``: what torch's ctc_loss computes, without its (T, N, C)
 * input copy, for the few hypotheses of one utterance).
 *
 * The same search as `asr_core.ctc_search._PrefixBeam`, step for step: candidates in WeNet's
 * update order (top-k tokens outer, prefixes inner; a repeated token spawns "same prefix"
 * then "prefix + token"), prefixes identified by trie nodes so that candidates reaching one
 * prefix merge, scores accumulated in candidate order with numpy's logaddexp formula, the
 * beam chosen by total score with ties kept in order of first appearance, and the Viterbi
 * scores and token times replayed for the survivors. The results equal the numpy version's
 * bit for bit (tests/test_ctc_search_native.py); the numpy version is the reference and runs
 * wherever this optional extension was not built.
 *
 * With a hotwords context graph (`asr_core.context_graph.ContextGraph.arrays()`), each prefix
 * carries its graph state and bonus, and the beam is chosen by total score + bonus, as the
 * numpy version does; the bonus is summed in the same order, so the results stay identical.
 *
 * Token times are kept as shared immutable lists (each cell: a frame and the cell before it,
 * the newest token first), so that a hypothesis' times cost one cell per new token instead of
 * a copy of the whole tuple per frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KIND_BLANK 0
#define KIND_REPEAT_SAME 1
#define KIND_REPEAT_NEW 2
#define KIND_EXTEND 3
#define TOKEN_STRIDE ((int64_t)1 << 24)
#define LOGE2 0.693147180559945309417232121458176568

/* numpy's npy_logaddexp, so that sums round exactly as np.logaddexp's do. */
static double logaddexp(double x, double y)
{
    if (x == y) {
        return x + LOGE2;
    }
    const double tmp = x - y;
    if (tmp > 0) {
        return x + log1p(exp(-tmp));
    }
    if (tmp <= 0) {
        return y + log1p(exp(tmp));
    }
    return tmp; /* NaN */
}

/* ---- growable arrays ---- */

static int grow(void **data, Py_ssize_t *capacity, Py_ssize_t needed, size_t item)
{
    if (needed <= *capacity) {
        return 0;
    }
    Py_ssize_t next = *capacity ? *capacity : 64;
    while (next < needed) {
        next *= 2;
    }
    void *bigger = realloc(*data, (size_t)next * item);
    if (bigger == NULL) {
        return -1;
    }
    *data = bigger;
    *capacity = next;
    return 0;
}

/* ---- trie: key (parent node * stride + token) -> node, open addressing ---- */

typedef struct {
    int64_t *keys; /* -1: empty */
    int64_t *nodes;
    Py_ssize_t capacity; /* a power of two */
    Py_ssize_t used;
} Trie;

static Py_ssize_t trie_slot(const Trie *trie, int64_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    Py_ssize_t mask = trie->capacity - 1;
    Py_ssize_t i = (Py_ssize_t)(h >> 17) & mask;
    while (trie->keys[i] != -1 && trie->keys[i] != key) {
        i = (i + 1) & mask;
    }
    return i;
}

static int trie_init(Trie *trie, Py_ssize_t capacity)
{
    trie->keys = malloc((size_t)capacity * sizeof(int64_t));
    trie->nodes = malloc((size_t)capacity * sizeof(int64_t));
    if (trie->keys == NULL || trie->nodes == NULL) {
        return -1;
    }
    memset(trie->keys, 0xff, (size_t)capacity * sizeof(int64_t)); /* all -1 */
    trie->capacity = capacity;
    trie->used = 0;
    return 0;
}

static int64_t trie_get(const Trie *trie, int64_t key)
{
    Py_ssize_t i = trie_slot(trie, key);
    return trie->keys[i] == key ? trie->nodes[i] : -1;
}

static int trie_put(Trie *trie, int64_t key, int64_t node)
{
    if (2 * (trie->used + 1) > trie->capacity) {
        Trie bigger;
        if (trie_init(&bigger, 2 * trie->capacity) < 0) {
            free(bigger.keys);
            free(bigger.nodes);
            return -1;
        }
        for (Py_ssize_t i = 0; i < trie->capacity; i++) {
            if (trie->keys[i] != -1) {
                Py_ssize_t j = trie_slot(&bigger, trie->keys[i]);
                bigger.keys[j] = trie->keys[i];
                bigger.nodes[j] = trie->nodes[i];
            }
        }
        bigger.used = trie->used;
        free(trie->keys);
        free(trie->nodes);
        *trie = bigger;
    }
    Py_ssize_t i = trie_slot(trie, key);
    if (trie->keys[i] == -1) {
        trie->used++;
    }
    trie->keys[i] = key;
    trie->nodes[i] = node;
    return 0;
}

/* ---- the hotwords context graph: a CSR trie with Aho-Corasick fail links ---- */

typedef struct {
    Py_ssize_t nodes;
    const int64_t *child_start; /* (N + 1,) children of node n: child_start[n] .. child_start[n+1] */
    const int64_t *child_token; /* (E,) sorted by token within a node */
    const int64_t *child_node;  /* (E,) */
    const int64_t *fail;        /* (N,) */
    const double *node_score;   /* (N,) */
    const double *kept_score;   /* (N,) */
} Graph;

static int64_t graph_child(const Graph *g, int64_t state, int64_t token)
{
    int64_t lo = g->child_start[state], hi = g->child_start[state + 1];
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (g->child_token[mid] < token) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < g->child_start[state + 1] && g->child_token[lo] == token ? g->child_node[lo] : -1;
}

/* ContextGraph.step: (delta, next state) for appending `token` in `state`. */
static double graph_step(const Graph *g, int64_t state, int64_t token, int64_t *next)
{
    int64_t child = graph_child(g, state, token);
    if (child >= 0) {
        *next = child;
        return g->node_score[child] - g->node_score[state];
    }
    int64_t to = 0;
    if (state != 0) {
        /* fail links lead to shallower nodes; the bound only guards against a malformed graph */
        Py_ssize_t guard = 0;
        for (int64_t at = g->fail[state]; guard < g->nodes; at = g->fail[at], guard++) {
            int64_t found = graph_child(g, at, token);
            if (found >= 0) {
                to = found;
                break;
            }
            if (at == 0) {
                break;
            }
        }
    }
    *next = to;
    return g->node_score[to] - (g->node_score[state] - g->kept_score[state]);
}

/* ---- the search ---- */

typedef struct {
    int kind;
    Py_ssize_t hyp;
    int64_t token;
    double prob;
    int64_t key;
    int64_t target; /* trie node, or -1 - candidate index for a prefix not in the trie yet */
    double contrib;
    Py_ssize_t group;
    double bonus;      /* context bonus of the prefix it reaches (with a graph) */
    int64_t ctx_state; /* and its graph state */
} Candidate;

typedef struct {
    int64_t target;
    Py_ssize_t first; /* index of its first candidate */
    double s, ns, total;
    double rank; /* total, + the bonus with a graph: what the beam keeps the best of */
} Group;

/* A link of a chain: a trie node (its token, its parent node) or a token-time cell (a frame,
 * the cell of the token before it). */
typedef struct {
    int64_t item;
    int64_t prev;
} Link;

typedef struct {
    /* trie nodes: node 0 is the empty prefix (no token, no parent) */
    Link *nodes;
    Py_ssize_t node_count, node_capacity;
    Trie trie;
    /* token times, newest token first; -1 is the empty list */
    Link *cells;
    Py_ssize_t cell_count, cell_capacity;
    /* the beam: hypotheses 0..size-1 */
    Py_ssize_t size;
    int64_t *node;
    double *s, *ns, *v_s, *v_ns;
    int64_t *times_s, *times_ns;
    /* scratch per frame */
    Candidate *cand;
    Group *groups;
    Py_ssize_t *order;
    Py_ssize_t *slot;
    int64_t *lookup_target; /* target -> group, open addressing over node targets */
    Py_ssize_t *lookup_group;
    Py_ssize_t lookup_capacity;
    int64_t *next_node;
    double *next_s, *next_ns, *next_v_s, *next_v_ns, *cur_prob;
    int64_t *next_times_s, *next_times_ns;
    /* the context graph (graph.nodes == 0: none) and each hypothesis' state and bonus */
    Graph graph;
    int64_t *ctx_state, *next_ctx_state;
    double *ctx_score, *next_ctx_score;
} Search;

static void search_free(Search *x)
{
    free(x->nodes);
    free(x->trie.keys);
    free(x->trie.nodes);
    free(x->cells);
    free(x->node);
    free(x->s);
    free(x->ns);
    free(x->v_s);
    free(x->v_ns);
    free(x->times_s);
    free(x->times_ns);
    free(x->cand);
    free(x->groups);
    free(x->order);
    free(x->slot);
    free(x->lookup_target);
    free(x->lookup_group);
    free(x->next_node);
    free(x->next_s);
    free(x->next_ns);
    free(x->next_v_s);
    free(x->next_v_ns);
    free(x->cur_prob);
    free(x->next_times_s);
    free(x->next_times_ns);
    free(x->ctx_state);
    free(x->next_ctx_state);
    free(x->ctx_score);
    free(x->next_ctx_score);
}

static int search_init(Search *x, Py_ssize_t beam, Py_ssize_t k)
{
    memset(x, 0, sizeof(*x));
    Py_ssize_t max_cand = 2 * beam * k;
    x->lookup_capacity = 1;
    while (x->lookup_capacity < 4 * max_cand) {
        x->lookup_capacity *= 2;
    }
#define ALLOC(field, count) (((field) = calloc((size_t)(count), sizeof(*(field)))) == NULL)
    if (ALLOC(x->node, beam) || ALLOC(x->s, beam) || ALLOC(x->ns, beam) || ALLOC(x->v_s, beam) ||
        ALLOC(x->v_ns, beam) || ALLOC(x->times_s, beam) || ALLOC(x->times_ns, beam) ||
        ALLOC(x->cand, max_cand) || ALLOC(x->groups, max_cand) || ALLOC(x->order, max_cand) ||
        ALLOC(x->slot, max_cand) || ALLOC(x->lookup_target, x->lookup_capacity) ||
        ALLOC(x->lookup_group, x->lookup_capacity) || ALLOC(x->next_node, beam) || ALLOC(x->next_s, beam) ||
        ALLOC(x->next_ns, beam) || ALLOC(x->next_v_s, beam) || ALLOC(x->next_v_ns, beam) ||
        ALLOC(x->cur_prob, beam) || ALLOC(x->next_times_s, beam) || ALLOC(x->next_times_ns, beam) ||
        ALLOC(x->ctx_state, beam) || ALLOC(x->next_ctx_state, beam) || ALLOC(x->ctx_score, beam) ||
        ALLOC(x->next_ctx_score, beam)) {
        return -1;
    }
#undef ALLOC
    if (trie_init(&x->trie, 1024) < 0) {
        return -1;
    }
    if (grow((void **)&x->nodes, &x->node_capacity, 1, sizeof(Link)) < 0) {
        return -1;
    }
    x->nodes[0].item = -1;
    x->nodes[0].prev = -1;
    x->node_count = 1;
    /* one hypothesis: the empty prefix, blank-ending with probability 1 */
    x->size = 1;
    x->node[0] = 0;
    x->s[0] = 0.0;
    x->ns[0] = -INFINITY;
    x->v_s[0] = 0.0;
    x->v_ns[0] = 0.0;
    x->times_s[0] = -1;
    x->times_ns[0] = -1;
    return 0;
}

/* Appends a link; returns its index, or -1 when out of memory. */
static int64_t append_link(Link **links, Py_ssize_t *count, Py_ssize_t *capacity, int64_t item, int64_t prev)
{
    if (grow((void **)links, capacity, *count + 1, sizeof(Link)) < 0) {
        return -1;
    }
    (*links)[*count].item = item;
    (*links)[*count].prev = prev;
    return (*count)++;
}

#define NEW_CELL(x, frame, prev) append_link(&(x)->cells, &(x)->cell_count, &(x)->cell_capacity, (frame), (prev))
#define NEW_NODE(x, parent, token) append_link(&(x)->nodes, &(x)->node_count, &(x)->node_capacity, (token), (parent))

static Py_ssize_t group_of(Search *x, Py_ssize_t *groups, int64_t target, Py_ssize_t candidate)
{
    if (target >= 0) {
        Py_ssize_t mask = x->lookup_capacity - 1;
        Py_ssize_t i = (Py_ssize_t)(((uint64_t)target * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
        while (x->lookup_target[i] != -1) {
            if (x->lookup_target[i] == target) {
                return x->lookup_group[i];
            }
            i = (i + 1) & mask;
        }
        x->lookup_target[i] = target;
        x->lookup_group[i] = *groups;
    }
    Group *g = &x->groups[*groups];
    g->target = target;
    g->first = candidate;
    g->s = -INFINITY;
    g->ns = -INFINITY;
    return (*groups)++;
}

static int search_step(Search *x, Py_ssize_t t, const double *values, const int64_t *ids, Py_ssize_t k,
                       Py_ssize_t beam, int64_t blank)
{
    Py_ssize_t hyps = x->size, count = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t u = ids[j];
        double p = values[j];
        for (Py_ssize_t h = 0; h < hyps; h++) {
            int64_t last = x->nodes[x->node[h]].item;
            int kinds[2], n = 1;
            if (u == blank) {
                kinds[0] = KIND_BLANK;
            }
            else if (u == last) {
                kinds[0] = KIND_REPEAT_SAME;
                kinds[1] = KIND_REPEAT_NEW;
                n = 2;
            }
            else {
                kinds[0] = KIND_EXTEND;
            }
            for (int r = 0; r < n; r++) {
                Candidate *c = &x->cand[count];
                c->kind = kinds[r];
                c->hyp = h;
                c->token = u;
                c->prob = p;
                c->key = x->node[h] * TOKEN_STRIDE + u;
                if (c->kind == KIND_REPEAT_NEW || c->kind == KIND_EXTEND) {
                    int64_t found = trie_get(&x->trie, c->key);
                    c->target = found >= 0 ? found : -1 - (int64_t)count;
                }
                else {
                    c->target = x->node[h];
                }
                double base;
                if (c->kind == KIND_REPEAT_SAME) {
                    base = x->ns[h];
                }
                else if (c->kind == KIND_REPEAT_NEW) {
                    base = x->s[h];
                }
                else {
                    base = logaddexp(x->s[h], x->ns[h]);
                }
                c->contrib = base + p;
                if (x->graph.nodes > 0) {
                    c->bonus = x->ctx_score[h];
                    c->ctx_state = x->ctx_state[h];
                    if (c->kind == KIND_REPEAT_NEW || c->kind == KIND_EXTEND) {
                        int64_t next;
                        c->bonus += graph_step(&x->graph, c->ctx_state, u, &next);
                        c->ctx_state = next;
                    }
                }
                count++;
            }
        }
    }

    /* merge candidates by prefix, accumulating in candidate order */
    Py_ssize_t groups = 0;
    memset(x->lookup_target, 0xff, (size_t)x->lookup_capacity * sizeof(int64_t));
    for (Py_ssize_t c = 0; c < count; c++) {
        Candidate *cand = &x->cand[c];
        cand->group = group_of(x, &groups, cand->target, c);
        Group *g = &x->groups[cand->group];
        if (cand->kind == KIND_BLANK) {
            g->s = logaddexp(g->s, cand->contrib);
        }
        else {
            g->ns = logaddexp(g->ns, cand->contrib);
        }
    }
    /* The best `beam` groups by total score, ties in order of first appearance (as
     * np.lexsort((first, -total))): groups are numbered in that order, so an insertion that
     * puts each one after the kept groups scoring at least as well keeps it. */
    Py_ssize_t size = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        Group *group = &x->groups[g];
        group->total = logaddexp(group->s, group->ns);
        group->rank = x->graph.nodes > 0 ? group->total + x->cand[group->first].bonus : group->total;
        x->slot[g] = -1;
        double key = -group->rank;
        Py_ssize_t pos = size;
        while (pos > 0 && -x->groups[x->order[pos - 1]].rank > key) {
            pos--;
        }
        if (pos >= beam) {
            continue;
        }
        Py_ssize_t end = size < beam ? size : beam - 1;
        memmove(&x->order[pos + 1], &x->order[pos], (size_t)(end - pos) * sizeof(Py_ssize_t));
        x->order[pos] = g;
        if (size < beam) {
            size++;
        }
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        x->slot[x->order[i]] = i;
        x->next_v_s[i] = -INFINITY;
        x->next_v_ns[i] = -INFINITY;
        x->cur_prob[i] = -INFINITY;
        x->next_times_s[i] = -1;
        x->next_times_ns[i] = -1;
    }

    /* Viterbi scores and token times of the survivors, in update order */
    for (Py_ssize_t c = 0; c < count; c++) {
        const Candidate *cand = &x->cand[c];
        Py_ssize_t i = x->slot[cand->group];
        if (i < 0) {
            continue;
        }
        Py_ssize_t h = cand->hyp;
        double p = cand->prob, h_vs = x->v_s[h], h_vns = x->v_ns[h];
        if (cand->kind == KIND_REPEAT_SAME) {
            if (x->next_v_ns[i] < h_vns + p) {
                x->next_v_ns[i] = h_vns + p;
                if (x->cur_prob[i] < p) {
                    x->cur_prob[i] = p;
                    int64_t times = x->times_ns[h];
                    int64_t cell = NEW_CELL(x, t, times >= 0 ? x->cells[times].prev : -1);
                    if (cell < 0) {
                        return -1;
                    }
                    x->next_times_ns[i] = cell;
                }
            }
            continue;
        }
        double viterbi = h_vs > h_vns ? h_vs : h_vns;
        int64_t times = h_vs > h_vns ? x->times_s[h] : x->times_ns[h];
        if (cand->kind == KIND_BLANK) {
            x->next_v_s[i] = viterbi + p;
            x->next_times_s[i] = times;
        }
        else if (cand->kind == KIND_REPEAT_NEW) {
            if (x->next_v_ns[i] < h_vs + p) {
                x->next_v_ns[i] = h_vs + p;
                x->cur_prob[i] = p;
                int64_t cell = NEW_CELL(x, t, x->times_s[h]);
                if (cell < 0) {
                    return -1;
                }
                x->next_times_ns[i] = cell;
            }
        }
        else if (x->next_v_ns[i] < viterbi + p) {
            x->next_v_ns[i] = viterbi + p;
            x->cur_prob[i] = p;
            int64_t cell = NEW_CELL(x, t, times);
            if (cell < 0) {
                return -1;
            }
            x->next_times_ns[i] = cell;
        }
    }

    /* the survivors' prefixes: a new trie node for a prefix seen for the first time */
    for (Py_ssize_t i = 0; i < size; i++) {
        const Group *g = &x->groups[x->order[i]];
        const Candidate *cand = &x->cand[g->first];
        int64_t node = cand->target;
        if (cand->kind == KIND_REPEAT_NEW || cand->kind == KIND_EXTEND) {
            if (node < 0) {
                node = NEW_NODE(x, x->node[cand->hyp], cand->token);
                if (node < 0 || trie_put(&x->trie, cand->key, node) < 0) {
                    return -1;
                }
            }
        }
        else {
            node = x->node[cand->hyp];
        }
        x->next_node[i] = node;
        x->next_ctx_state[i] = cand->ctx_state;
        x->next_ctx_score[i] = cand->bonus;
        x->next_s[i] = g->s;
        x->next_ns[i] = g->ns;
    }
    x->size = size;
    memcpy(x->node, x->next_node, (size_t)size * sizeof(int64_t));
    memcpy(x->s, x->next_s, (size_t)size * sizeof(double));
    memcpy(x->ns, x->next_ns, (size_t)size * sizeof(double));
    memcpy(x->v_s, x->next_v_s, (size_t)size * sizeof(double));
    memcpy(x->v_ns, x->next_v_ns, (size_t)size * sizeof(double));
    memcpy(x->times_s, x->next_times_s, (size_t)size * sizeof(int64_t));
    memcpy(x->times_ns, x->next_times_ns, (size_t)size * sizeof(int64_t));
    if (x->graph.nodes > 0) {
        memcpy(x->ctx_state, x->next_ctx_state, (size_t)size * sizeof(int64_t));
        memcpy(x->ctx_score, x->next_ctx_score, (size_t)size * sizeof(double));
    }
    return 0;
}

/* The items of the chain from link `start` back to link `stop` (not included), oldest first. */
static PyObject *chain_tuple(const Link *links, int64_t start, int64_t stop)
{
    Py_ssize_t length = 0;
    for (int64_t i = start; i != stop; i = links[i].prev) {
        length++;
    }
    PyObject *tuple = PyTuple_New(length);
    if (tuple == NULL) {
        return NULL;
    }
    for (int64_t i = start; i != stop; i = links[i].prev) {
        PyObject *value = PyLong_FromLongLong(links[i].item);
        if (value == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, --length, value);
    }
    return tuple;
}

static PyObject *search_nbest(const Search *x)
{
    PyObject *result = PyList_New(x->size);
    if (result == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < x->size; i++) {
        PyObject *tokens = chain_tuple(x->nodes, x->node[i], 0);
        int64_t times_start = x->v_s[i] > x->v_ns[i] ? x->times_s[i] : x->times_ns[i];
        PyObject *times = chain_tuple(x->cells, times_start, -1);
        PyObject *entry = NULL;
        if (tokens != NULL && times != NULL && x->graph.nodes > 0) {
            entry = Py_BuildValue("(OdOdL)", tokens, logaddexp(x->s[i], x->ns[i]), times, x->ctx_score[i],
                                  (long long)x->ctx_state[i]);
        }
        else if (tokens != NULL && times != NULL) {
            entry = Py_BuildValue("(OdO)", tokens, logaddexp(x->s[i], x->ns[i]), times);
        }
        Py_XDECREF(tokens);
        Py_XDECREF(times);
        if (entry == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, entry);
    }
    return result;
}

static int matrix(PyObject *object, Py_buffer *view, const char *name, const char *formats)
{
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') {
        format++;
    }
    if (view->ndim != 2 || view->itemsize != 8 || strlen(format) != 1 || strchr(formats, format[0]) == NULL) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous 2-D array of 8-byte items (%s)", name, formats);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int vector(PyObject *object, Py_buffer *view, const char *name, const char *formats, Py_ssize_t length)
{
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') {
        format++;
    }
    if (view->ndim != 1 || view->itemsize != 8 || strlen(format) != 1 || strchr(formats, format[0]) == NULL ||
        (length >= 0 && view->shape[0] != length)) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous 1-D array of 8-byte items (%s)%s", name, formats,
                     length >= 0 ? " of the expected length" : "");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The graph from ContextGraph.arrays(): (child_start, child_token, child_node, fail, node_score,
 * kept_score). Checks that every index stays inside the arrays. */
static int graph_arrays(PyObject *tuple, Py_buffer *views, int *held, Graph *graph)
{
    static const char *names[6] = {"graph child_start", "graph child_token", "graph child_node",
                                   "graph fail",        "graph node_score",  "graph kept_score"};
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 6) {
        PyErr_SetString(PyExc_ValueError, "graph must be the 6-tuple of ContextGraph.arrays()");
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        Py_ssize_t length = -1;
        if (i == 2) {
            length = views[1].shape[0];
        }
        else if (i >= 3) {
            length = views[0].shape[0] - 1;
        }
        if (vector(PyTuple_GET_ITEM(tuple, i), &views[i], names[i], i >= 4 ? "d" : "lq", length) < 0) {
            return -1;
        }
        (*held)++;
    }
    Py_ssize_t nodes = views[0].shape[0] - 1, edges = views[1].shape[0];
    const int64_t *start = views[0].buf, *child = views[2].buf, *fail = views[3].buf;
    int bad = nodes < 1 || start[0] != 0 || start[nodes] != edges;
    for (Py_ssize_t n = 0; n < nodes && !bad; n++) {
        bad = start[n] > start[n + 1] || fail[n] < 0 || fail[n] >= nodes;
    }
    for (Py_ssize_t e = 0; e < edges && !bad; e++) {
        bad = child[e] <= 0 || child[e] >= nodes;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "graph arrays are not a trie (see ContextGraph.arrays())");
        return -1;
    }
    graph->nodes = nodes;
    graph->child_start = start;
    graph->child_token = views[1].buf;
    graph->child_node = child;
    graph->fail = fail;
    graph->node_score = views[4].buf;
    graph->kept_score = views[5].buf;
    return 0;
}

static PyObject *prefix_beam_search(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *values_obj, *ids_obj, *graph_obj = Py_None;
    Py_ssize_t beam;
    long long blank;
    if (!PyArg_ParseTuple(args, "OOnL|O", &values_obj, &ids_obj, &beam, &blank, &graph_obj)) {
        return NULL;
    }
    if (beam < 1) {
        PyErr_SetString(PyExc_ValueError, "beam must be at least 1");
        return NULL;
    }
    Py_buffer values, ids;
    if (matrix(values_obj, &values, "values", "d") < 0) {
        return NULL;
    }
    if (matrix(ids_obj, &ids, "ids", "lq") < 0) {
        PyBuffer_Release(&values);
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer views[6];
    int held = 0;
    Graph graph = {0};
    Py_ssize_t frames = values.shape[0], k = values.shape[1];
    if (ids.shape[0] != frames || ids.shape[1] != k) {
        PyErr_SetString(PyExc_ValueError, "values and ids must have the same shape");
        goto done;
    }
    if (graph_obj != Py_None && graph_arrays(graph_obj, views, &held, &graph) < 0) {
        goto done;
    }
    Search search;
    if (search_init(&search, beam, k > 0 ? k : 1) < 0) {
        search_free(&search);
        PyErr_NoMemory();
        goto done;
    }
    search.graph = graph; /* every hypothesis starts at the root (0) with no bonus (calloc) */
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < frames && !failed; t++) {
        failed = search_step(&search, t, (const double *)values.buf + t * k, (const int64_t *)ids.buf + t * k, k, beam,
                             (int64_t)blank) < 0;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
    }
    else {
        result = search_nbest(&search);
    }
    search_free(&search);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&ids);
    return result;
}

/* ---- CTC forward: log P(y | x) summed over every alignment ---- */

/* The forward (alpha) recursion of one label sequence over emissions `em` (T, classes): states
 * blank, y0, blank, y1, ..., blank; two rows of 2L+1 states. -inf when no alignment fits. */
static double ctc_forward_one(const double *em, Py_ssize_t frames, Py_ssize_t classes, const int64_t *labels,
                              Py_ssize_t length, int64_t blank, double *alpha, double *next)
{
    const Py_ssize_t states = 2 * length + 1;
    for (Py_ssize_t s = 0; s < states; s++) {
        alpha[s] = -INFINITY;
    }
    alpha[0] = em[blank];
    if (length > 0) {
        alpha[1] = em[labels[0]];
    }
    for (Py_ssize_t t = 1; t < frames; t++) {
        const double *row = em + t * classes;
        /* A state can only be reached from the states at most two behind it, so at frame t only
         * states below 2(t+1) are live; the rest stay -inf. */
        const Py_ssize_t live = states < 2 * (t + 1) ? states : 2 * (t + 1);
        for (Py_ssize_t s = 0; s < live; s++) {
            double sum = alpha[s];
            if (s >= 1) {
                sum = logaddexp(sum, alpha[s - 1]);
            }
            const int token_state = s % 2 == 1;
            if (token_state && s >= 3 && labels[s / 2] != labels[s / 2 - 1]) {
                sum = logaddexp(sum, alpha[s - 2]);
            }
            next[s] = sum + row[token_state ? labels[s / 2] : blank];
        }
        for (Py_ssize_t s = live; s < states; s++) {
            next[s] = -INFINITY;
        }
        double *swap = alpha;
        alpha = next;
        next = swap;
    }
    return length > 0 ? logaddexp(alpha[states - 1], alpha[states - 2]) : alpha[0];
}

static PyObject *ctc_forward(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *em_obj, *labels_obj, *lengths_obj;
    long long blank;
    if (!PyArg_ParseTuple(args, "OOOL", &em_obj, &labels_obj, &lengths_obj, &blank)) {
        return NULL;
    }
    Py_buffer em, labels, lengths;
    if (matrix(em_obj, &em, "emissions", "d") < 0) {
        return NULL;
    }
    if (matrix(labels_obj, &labels, "labels", "lq") < 0) {
        PyBuffer_Release(&em);
        return NULL;
    }
    if (vector(lengths_obj, &lengths, "lengths", "lq", labels.shape[0]) < 0) {
        PyBuffer_Release(&em);
        PyBuffer_Release(&labels);
        return NULL;
    }
    PyObject *result = NULL;
    double *scores = NULL, *rows = NULL;
    const Py_ssize_t frames = em.shape[0], classes = em.shape[1], count = labels.shape[0], longest = labels.shape[1];
    const int64_t *label = labels.buf, *length = lengths.buf;
    if (frames < 1 || blank < 0 || blank >= classes) {
        PyErr_SetString(PyExc_ValueError, "emissions need at least one frame and a blank class inside them");
        goto done;
    }
    for (Py_ssize_t n = 0; n < count; n++) {
        if (length[n] < 0 || length[n] > longest) {
            PyErr_Format(PyExc_ValueError, "lengths[%zd] = %lld is outside 0..%zd", n, (long long)length[n], longest);
            goto done;
        }
        for (Py_ssize_t i = 0; i < length[n]; i++) {
            if (label[n * longest + i] < 0 || label[n * longest + i] >= classes) {
                PyErr_Format(PyExc_ValueError, "labels[%zd] names a class outside 0..%zd", n, classes - 1);
                goto done;
            }
        }
    }
    scores = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(double));
    rows = PyMem_RawMalloc((size_t)(2 * (2 * longest + 1)) * sizeof(double));
    if (scores == NULL || rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < count; n++) {
        scores[n] = ctc_forward_one(em.buf, frames, classes, label + n * longest, length[n], (int64_t)blank, rows,
                                    rows + 2 * longest + 1);
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(count);
    for (Py_ssize_t n = 0; result != NULL && n < count; n++) {
        PyObject *value = PyFloat_FromDouble(scores[n]);
        if (value == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, n, value);
    }
done:
    PyMem_RawFree(scores);
    PyMem_RawFree(rows);
    PyBuffer_Release(&em);
    PyBuffer_Release(&labels);
    PyBuffer_Release(&lengths);
    return result;
}

static PyMethodDef methods[] = {
    {"prefix_beam_search", prefix_beam_search, METH_VARARGS,
     "prefix_beam_search(values, ids, beam, blank, graph=None) -> [(tokens, score, times)], best first.\n\n"
     "values: (T, K) float64 log-posteriors of each frame's top K, best first; ids: (T, K) int64.\n"
     "graph: ContextGraph.arrays(); entries then add (bonus, graph state), unfinalized."},
    {"ctc_forward", ctc_forward, METH_VARARGS,
     "ctc_forward(emissions, labels, lengths, blank) -> [log P(labels[n][:lengths[n]])], -inf if impossible.\n\n"
     "emissions: (T, C) float64 log-posteriors of C classes; labels: (N, L) int64 class indices (no blank\n"
     "between repeats needed: CTC's own rule); lengths: (N,) int64; blank: the blank's class."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastctc",
    .m_doc = "CTC prefix beam search and CTC forward scores in C (see asr_core.ctc_search).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastctc(void)
{
    return PyModule_Create(&module);
}
