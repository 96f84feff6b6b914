/* The RTP receive loop's common case in C: `rtp.poller.DatagramPoller` hands its epoll set to
 * a `Receiver`, which reads every ready socket and takes the packets that continue an
 * in-order G.711 stream exactly as the leg expects them (the leg "arms" it with what it
 * expects next), appending their payloads to the leg's batch without creating a Python
 * object per packet. Everything else goes back to Python untouched: packets that break the
 * expectation (loss, reordering, another source, another payload type or SSRC, RTCP, bad
 * headers) disarm the leg and are returned with their address, to go through
 * `RtpLeg.handle_rtp` after the leg has taken over the state kept here; sockets the receiver
 * does not know (RTCP) are returned as ready file descriptors for Python to read.
 * Before all that, each leg's source screen (`rtp.latch`, set by `screen()`) drops datagrams
 * from addresses the leg's policy refuses, armed or not, counting them: a stranger's packets
 * never reach Python, never disarm the leg.
 * An SRTP leg (`set_srtp()`: libsrtp's `srtp_unprotect` and the leg's session, both from
 * `rtp.srtp`) is taken the same way: a packet whose clear header continues the stream and
 * whose size is the payload's plus the authentication tag is unprotected in place; one that
 * fails (authentication, replay) is left as it was and goes to Python, which counts it.
 *
 * One `poll()` call is one epoll pass: each ready socket is read once, as the Python poller
 * does (the set is level-triggered; a socket with more data is reported again next pass).
 * Linux only, like the poller. Built as an optional extension: without it the pure Python
 * path runs.
 *
 * Also here: `upsample_rows`, the fixed-point half-band upsampler's inner loop
 * (`rtp.resample.upsample_rows`), the same exact integer dot products without a BLAS call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#define HEADER_BYTES 12
#define MAX_FAST_PAYLOAD 1024
#define MAX_DATAGRAM 65536
#define MAX_EVENTS 1024
#define CLOCK_RATE 8000.0

/* libsrtp 2's srtp_unprotect(srtp_t, void *packet, int *length): 0 when authentic and fresh,
 * the packet then decrypted in place and *length less its tag; on failure the packet is
 * untouched (the tag and replay checks come before decryption). */
typedef int (*unprotect_fn)(void *session, void *packet, int *length);

typedef struct {
    PyObject *owner; /* the leg: strong reference while registered */
    int armed;
    uint16_t next_seq;
    uint8_t payload_type;
    uint32_t ssrc;
    uint32_t next_timestamp;
    uint32_t payload_bytes;
    int family; /* AF_INET or AF_INET6 of the latched source */
    unsigned char address[16];
    uint16_t port; /* host order */
    unsigned char *batch;
    Py_ssize_t batch_len;
    Py_ssize_t batch_bytes;
    Py_ssize_t batch_start; /* bytes the leg already holds toward the first batch after arm() */
    unsigned long long since_arm; /* packets taken since the last arm() */
    /* since the last take: */
    unsigned long long packets;
    unsigned long long bytes;
    double last_arrival;
    /* RFC 3550 interarrival jitter, in clock ticks, continued from the leg's values */
    double jitter_ticks;
    double jitter_arrival;
    uint32_t jitter_timestamp;
    /* source screen: when `screening`, only datagrams from screen_address (and screen_port
     * unless 0) are read further; others are counted by reason and dropped */
    int screening;
    int screen_family;
    unsigned char screen_address[16];
    uint16_t screen_port;
    unsigned long long foreign_address; /* since the last take */
    unsigned long long foreign_port;
    /* SRTP: set by set_srtp(); `srtp_owner` keeps the session object (and so `srtp_session`) alive */
    PyObject *srtp_owner;
    void *srtp_session;
    unprotect_fn unprotect;
    uint32_t srtp_trailer; /* bytes after the payload: the authentication tag */
    unsigned char last_payload[MAX_FAST_PAYLOAD];
} Leg;

typedef struct {
    PyObject_HEAD
    int epoll_fd;
    Leg **legs; /* indexed by socket fd */
    int capacity;
    unsigned char *datagram;
} Receiver;

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static Leg *leg_for(Receiver *self, int fd) {
    if (fd < 0 || fd >= self->capacity) {
        return NULL;
    }
    return self->legs[fd];
}

static Leg *leg_or_error(Receiver *self, int fd) {
    Leg *leg = leg_for(self, fd);
    if (leg == NULL) {
        PyErr_Format(PyExc_KeyError, "socket %d is not registered", fd);
    }
    return leg;
}

static void free_leg(Leg *leg) {
    Py_XDECREF(leg->owner);
    Py_XDECREF(leg->srtp_owner);
    PyMem_Free(leg->batch);
    PyMem_Free(leg);
}

static int Receiver_init(Receiver *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"epoll_fd", NULL};
    int epoll_fd;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i", keywords, &epoll_fd)) {
        return -1;
    }
    self->epoll_fd = epoll_fd;
    self->datagram = PyMem_Malloc(MAX_DATAGRAM);
    if (self->datagram == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The receiver holds its legs, which hold their poller, which holds the receiver: the cycle
 * is broken when legs close (unregister), and by the collector for legs never closed. */
static int Receiver_traverse(Receiver *self, visitproc visit, void *arg) {
    for (int fd = 0; fd < self->capacity; fd++) {
        if (self->legs[fd] != NULL) {
            Py_VISIT(self->legs[fd]->owner);
            Py_VISIT(self->legs[fd]->srtp_owner);
        }
    }
    return 0;
}

static int Receiver_clear(Receiver *self) {
    for (int fd = 0; fd < self->capacity; fd++) {
        if (self->legs[fd] != NULL) {
            Leg *leg = self->legs[fd];
            self->legs[fd] = NULL;
            free_leg(leg);
        }
    }
    return 0;
}

static void Receiver_dealloc(Receiver *self) {
    PyObject_GC_UnTrack(self);
    Receiver_clear(self);
    PyMem_Free(self->legs);
    PyMem_Free(self->datagram);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* register(fd, owner, batch_bytes): read `fd` here from now on; full batches go to `owner`. */
static PyObject *Receiver_register(Receiver *self, PyObject *args) {
    int fd;
    PyObject *owner;
    Py_ssize_t batch_bytes;
    if (!PyArg_ParseTuple(args, "iOn", &fd, &owner, &batch_bytes)) {
        return NULL;
    }
    if (fd < 0 || batch_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "need a socket fd >= 0 and batch_bytes >= 1");
        return NULL;
    }
    if (fd >= self->capacity) {
        int capacity = self->capacity ? self->capacity : 1024;
        while (capacity <= fd) {
            capacity *= 2;
        }
        Leg **legs = PyMem_Realloc(self->legs, sizeof(Leg *) * (size_t)capacity);
        if (legs == NULL) {
            return PyErr_NoMemory();
        }
        memset(legs + self->capacity, 0, sizeof(Leg *) * (size_t)(capacity - self->capacity));
        self->legs = legs;
        self->capacity = capacity;
    }
    if (self->legs[fd] != NULL) {
        PyErr_Format(PyExc_ValueError, "socket %d is already registered", fd);
        return NULL;
    }
    Leg *leg = PyMem_Calloc(1, sizeof(Leg));
    if (leg == NULL) {
        return PyErr_NoMemory();
    }
    leg->batch = PyMem_Malloc((size_t)batch_bytes + MAX_FAST_PAYLOAD);
    if (leg->batch == NULL) {
        PyMem_Free(leg);
        return PyErr_NoMemory();
    }
    leg->batch_bytes = batch_bytes;
    Py_INCREF(owner);
    leg->owner = owner;
    self->legs[fd] = leg;
    Py_RETURN_NONE;
}

static PyObject *Receiver_unregister(Receiver *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) {
        return NULL;
    }
    Leg *leg = leg_for(self, fd);
    if (leg != NULL) {
        self->legs[fd] = NULL;
        free_leg(leg);
    }
    Py_RETURN_NONE;
}

/* arm(fd, next_seq, ssrc, next_timestamp, payload_bytes, payload_type, address, port,
 *     jitter_ticks, jitter_arrival, jitter_timestamp, queued): take packets that continue the
 * stream. `address` is the latched source's packed address (4 or 16 bytes); `queued` the
 * payload bytes the leg holds toward its next batch (the first batch handed out is shorter
 * by that much, so batches stay aligned). */
static PyObject *Receiver_arm(Receiver *self, PyObject *args) {
    int fd, payload_type, port;
    unsigned long next_seq, ssrc, next_timestamp, payload_bytes, jitter_timestamp;
    const char *address;
    Py_ssize_t address_len;
    double jitter_ticks, jitter_arrival;
    Py_ssize_t queued;
    if (!PyArg_ParseTuple(args, "ikkkkiy#iddkn", &fd, &next_seq, &ssrc, &next_timestamp, &payload_bytes,
                          &payload_type, &address, &address_len, &port, &jitter_ticks, &jitter_arrival,
                          &jitter_timestamp, &queued)) {
        return NULL;
    }
    Leg *leg = leg_or_error(self, fd);
    if (leg == NULL) {
        return NULL;
    }
    if ((address_len != 4 && address_len != 16) || payload_bytes == 0 || payload_bytes > MAX_FAST_PAYLOAD) {
        Py_RETURN_FALSE; /* not a case the fast path takes */
    }
    leg->next_seq = (uint16_t)next_seq;
    leg->ssrc = (uint32_t)ssrc;
    leg->next_timestamp = (uint32_t)next_timestamp;
    leg->payload_bytes = (uint32_t)payload_bytes;
    leg->payload_type = (uint8_t)payload_type;
    leg->family = address_len == 4 ? AF_INET : AF_INET6;
    memcpy(leg->address, address, (size_t)address_len);
    leg->port = (uint16_t)port;
    leg->jitter_ticks = jitter_ticks;
    leg->jitter_arrival = jitter_arrival;
    leg->jitter_timestamp = (uint32_t)jitter_timestamp;
    leg->since_arm = 0;
    leg->batch_len = 0;
    leg->batch_start = queued < 0 ? 0 : queued;
    leg->armed = 1;
    Py_RETURN_TRUE;
}

/* set_srtp(fd, owner or None, session, unprotect, trailer): unprotect the leg's packets with
 * `unprotect` (the address of libsrtp's srtp_unprotect) on `session` (an srtp_t), both kept
 * valid by `owner`; `trailer` is the tag's length. None: plain RTP. Disarms the leg. */
static PyObject *Receiver_set_srtp(Receiver *self, PyObject *args) {
    int fd;
    PyObject *owner;
    unsigned long long session, unprotect;
    unsigned int trailer;
    if (!PyArg_ParseTuple(args, "iOKKI", &fd, &owner, &session, &unprotect, &trailer)) {
        return NULL;
    }
    Leg *leg = leg_or_error(self, fd);
    if (leg == NULL) {
        return NULL;
    }
    int plain = owner == Py_None;
    if (!plain && (session == 0 || unprotect == 0 || trailer > MAX_FAST_PAYLOAD)) {
        PyErr_SetString(PyExc_ValueError, "set_srtp needs a session, an unprotect function and a tag length");
        return NULL;
    }
    leg->armed = 0;
    Py_XDECREF(leg->srtp_owner);
    leg->srtp_owner = NULL;
    leg->srtp_session = NULL;
    leg->unprotect = NULL;
    leg->srtp_trailer = 0;
    if (!plain) {
        Py_INCREF(owner);
        leg->srtp_owner = owner;
        leg->srtp_session = (void *)(uintptr_t)session;
        leg->unprotect = (unprotect_fn)(uintptr_t)unprotect;
        leg->srtp_trailer = trailer;
    }
    Py_RETURN_NONE;
}

/* screen(fd, address or None, port): drop datagrams unless from `address` (packed, 4 or 16
 * bytes) and, unless `port` is 0, that port; None drops none. */
static PyObject *Receiver_screen(Receiver *self, PyObject *args) {
    int fd, port;
    const char *address;
    Py_ssize_t address_len;
    if (!PyArg_ParseTuple(args, "iz#i", &fd, &address, &address_len, &port)) {
        return NULL;
    }
    Leg *leg = leg_or_error(self, fd);
    if (leg == NULL) {
        return NULL;
    }
    if (address == NULL) {
        leg->screening = 0;
        Py_RETURN_NONE;
    }
    if ((address_len != 4 && address_len != 16) || port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "need a packed IPv4 or IPv6 address and a port in 0-65535");
        return NULL;
    }
    leg->screen_family = address_len == 4 ? AF_INET : AF_INET6;
    memcpy(leg->screen_address, address, (size_t)address_len);
    leg->screen_port = (uint16_t)port;
    leg->screening = 1;
    Py_RETURN_NONE;
}

/* take(fd, disarm): (packets, bytes, last_arrival, jitter_ticks, jitter_arrival,
 * jitter_timestamp, since_arm, next_timestamp, last_payload or None, pending batch bytes,
 * foreign_address, foreign_port):
 * packets and bytes since the last take (they restart at 0), packets since the last arm, the
 * payload of the last of those, and with disarm the batch not yet handed out (the leg then
 * stops taking packets; without disarm `pending` is empty); the datagrams the screen dropped
 * since the last take, by reason. */
static PyObject *Receiver_take(Receiver *self, PyObject *args) {
    int fd, disarm;
    if (!PyArg_ParseTuple(args, "ip", &fd, &disarm)) {
        return NULL;
    }
    Leg *leg = leg_or_error(self, fd);
    if (leg == NULL) {
        return NULL;
    }
    PyObject *last_payload;
    if (leg->since_arm) {
        last_payload = PyBytes_FromStringAndSize((const char *)leg->last_payload, leg->payload_bytes);
    } else {
        Py_INCREF(Py_None);
        last_payload = Py_None;
    }
    PyObject *pending = PyBytes_FromStringAndSize((const char *)leg->batch, disarm ? leg->batch_len : 0);
    if (last_payload == NULL || pending == NULL) {
        Py_XDECREF(last_payload);
        Py_XDECREF(pending);
        return NULL;
    }
    PyObject *result = Py_BuildValue("KKdddkKkNNKK", leg->packets, leg->bytes, leg->last_arrival,
                                     leg->jitter_ticks, leg->jitter_arrival, (unsigned long)leg->jitter_timestamp,
                                     leg->since_arm, (unsigned long)leg->next_timestamp,
                                     last_payload, pending, leg->foreign_address, leg->foreign_port);
    if (result == NULL) {
        return NULL;
    }
    leg->packets = 0;
    leg->bytes = 0;
    leg->foreign_address = 0;
    leg->foreign_port = 0;
    if (disarm) {
        leg->armed = 0;
        leg->batch_len = 0;
    }
    return result;
}

static int source_matches(const Leg *leg, const struct sockaddr_storage *source) {
    if (source->ss_family == AF_INET && leg->family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)source;
        return ntohs(in4->sin_port) == leg->port && memcmp(&in4->sin_addr, leg->address, 4) == 0;
    }
    if (source->ss_family == AF_INET6 && leg->family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)source;
        return ntohs(in6->sin6_port) == leg->port && memcmp(&in6->sin6_addr, leg->address, 16) == 0;
    }
    return 0;
}

/* Whether the leg's source screen lets a datagram from `source` through; counts it if not. An
 * IPv4-mapped IPv6 source is compared as the IPv4 address it carries. */
static int screen_allows(Leg *leg, const struct sockaddr_storage *source) {
    if (!leg->screening) {
        return 1;
    }
    const unsigned char *address = NULL;
    uint16_t port = 0;
    if (source->ss_family == AF_INET && leg->screen_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)source;
        address = (const unsigned char *)&in4->sin_addr;
        port = ntohs(in4->sin_port);
    } else if (source->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)source;
        port = ntohs(in6->sin6_port);
        if (leg->screen_family == AF_INET6) {
            address = (const unsigned char *)&in6->sin6_addr;
        } else if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            address = (const unsigned char *)&in6->sin6_addr + 12;
        }
    }
    size_t length = leg->screen_family == AF_INET ? 4 : 16;
    if (address == NULL || memcmp(address, leg->screen_address, length) != 0) {
        leg->foreign_address += 1;
        return 0;
    }
    if (leg->screen_port != 0 && port != leg->screen_port) {
        leg->foreign_port += 1;
        return 0;
    }
    return 1;
}

/* The address tuple Python's socket.recvfrom would give. */
static PyObject *address_tuple(const struct sockaddr_storage *source) {
    char host[INET6_ADDRSTRLEN];
    if (source->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)source;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        return Py_BuildValue("(sHkk)", host, ntohs(in6->sin6_port), (unsigned long)ntohl(in6->sin6_flowinfo),
                             (unsigned long)in6->sin6_scope_id);
    }
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)source;
    inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
    return Py_BuildValue("(sH)", host, ntohs(in4->sin_port));
}

/* Take one datagram into the armed leg's batch if it continues the stream; 1 if taken. An
 * SRTP leg's datagram is unprotected in place first (left as it was when that fails). */
static int take_in_order(Leg *leg, unsigned char *data, Py_ssize_t size, const struct sockaddr_storage *source) {
    if (!leg->armed || size != HEADER_BYTES + (Py_ssize_t)leg->payload_bytes + leg->srtp_trailer || data[0] != 0x80 ||
        (data[1] & 0x7F) != leg->payload_type) {
        return 0;
    }
    uint16_t seq = (uint16_t)((data[2] << 8) | data[3]);
    uint32_t timestamp = ((uint32_t)data[4] << 24) | ((uint32_t)data[5] << 16) | ((uint32_t)data[6] << 8) | data[7];
    uint32_t ssrc = ((uint32_t)data[8] << 24) | ((uint32_t)data[9] << 16) | ((uint32_t)data[10] << 8) | data[11];
    if (seq != leg->next_seq || timestamp != leg->next_timestamp || ssrc != leg->ssrc ||
        !source_matches(leg, source)) {
        return 0;
    }
    if (leg->unprotect != NULL) {
        int length = (int)size;
        if (leg->unprotect(leg->srtp_session, data, &length) != 0 || length != HEADER_BYTES + (int)leg->payload_bytes) {
            return 0;
        }
        size = length;
    }
    double now = monotonic_seconds();
    double transit_change = (now - leg->jitter_arrival) * CLOCK_RATE - (double)(int32_t)(timestamp - leg->jitter_timestamp);
    leg->jitter_ticks += (fabs(transit_change) - leg->jitter_ticks) / 16.0;
    leg->jitter_arrival = now;
    leg->jitter_timestamp = timestamp;
    leg->last_arrival = now;
    leg->packets += 1;
    leg->since_arm += 1;
    leg->bytes += (unsigned long long)size;
    leg->next_seq = (uint16_t)(seq + 1);
    leg->next_timestamp = timestamp + leg->payload_bytes;
    memcpy(leg->last_payload, data + HEADER_BYTES, leg->payload_bytes);
    memcpy(leg->batch + leg->batch_len, data + HEADER_BYTES, leg->payload_bytes);
    leg->batch_len += leg->payload_bytes;
    return 1;
}

static int append_pair(PyObject *list, PyObject *first, PyObject *second) {
    PyObject *pair = PyTuple_Pack(2, first, second);
    if (pair == NULL) {
        return -1;
    }
    int status = PyList_Append(list, pair);
    Py_DECREF(pair);
    return status;
}

/* poll(): one epoll pass. Returns (batches, slow, others, events):
 *   batches: [(owner, payload bytes)] full batches of taken packets, in arrival order;
 *   slow:    [(fd, datagram, address)] datagrams the fast path did not take, for the
 *            socket's Python handler (which calls take(fd, True) first if the leg is armed);
 *   others:  [fd] ready sockets that are not registered, for Python to read;
 *   events:  how many sockets were ready (0: nothing left to read). */
static PyObject *Receiver_poll(Receiver *self, PyObject *Py_UNUSED(ignored)) {
    struct epoll_event events[MAX_EVENTS];
    int ready = epoll_wait(self->epoll_fd, events, MAX_EVENTS, 0);
    if (ready < 0) {
        if (errno == EINTR) {
            ready = 0;
        } else {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    PyObject *batches = PyList_New(0), *slow = PyList_New(0), *others = PyList_New(0);
    if (batches == NULL || slow == NULL || others == NULL) {
        goto error;
    }
    for (int i = 0; i < ready; i++) {
        int fd = events[i].data.fd;
        Leg *leg = leg_for(self, fd);
        if (leg == NULL) {
            PyObject *number = PyLong_FromLong(fd);
            if (number == NULL || PyList_Append(others, number) < 0) {
                Py_XDECREF(number);
                goto error;
            }
            Py_DECREF(number);
            continue;
        }
        struct sockaddr_storage source;
        socklen_t source_len = sizeof(source);
        ssize_t size = recvfrom(fd, self->datagram, MAX_DATAGRAM, MSG_DONTWAIT, (struct sockaddr *)&source, &source_len);
        if (size < 0) {
            continue; /* EAGAIN, or an ICMP error reported on the socket: nothing to read */
        }
        if (!screen_allows(leg, &source)) {
            continue;
        }
        if (take_in_order(leg, self->datagram, size, &source)) {
            if (leg->batch_start + leg->batch_len >= leg->batch_bytes) {
                PyObject *batch = PyBytes_FromStringAndSize((const char *)leg->batch, leg->batch_len);
                if (batch == NULL || append_pair(batches, leg->owner, batch) < 0) {
                    Py_XDECREF(batch);
                    goto error;
                }
                Py_DECREF(batch);
                leg->batch_len = 0;
                leg->batch_start = 0;
            }
            continue;
        }
        PyObject *datagram = PyBytes_FromStringAndSize((const char *)self->datagram, size);
        PyObject *address = datagram ? address_tuple(&source) : NULL;
        PyObject *item = address ? Py_BuildValue("(iOO)", fd, datagram, address) : NULL;
        Py_XDECREF(datagram);
        Py_XDECREF(address);
        if (item == NULL || PyList_Append(slow, item) < 0) {
            Py_XDECREF(item);
            goto error;
        }
        Py_DECREF(item);
    }
    return Py_BuildValue("NNNi", batches, slow, others, ready);
error:
    Py_XDECREF(batches);
    Py_XDECREF(slow);
    Py_XDECREF(others);
    return NULL;
}

static PyMethodDef Receiver_methods[] = {
    {"register", (PyCFunction)Receiver_register, METH_VARARGS, "register(fd, owner, batch_bytes)"},
    {"unregister", (PyCFunction)Receiver_unregister, METH_VARARGS, "unregister(fd)"},
    {"arm", (PyCFunction)Receiver_arm, METH_VARARGS, "arm(fd, ...) -> bool"},
    {"screen", (PyCFunction)Receiver_screen, METH_VARARGS, "screen(fd, address or None, port)"},
    {"set_srtp", (PyCFunction)Receiver_set_srtp, METH_VARARGS, "set_srtp(fd, owner, session, unprotect, trailer)"},
    {"take", (PyCFunction)Receiver_take, METH_VARARGS, "take(fd, disarm) -> tuple"},
    {"poll", (PyCFunction)Receiver_poll, METH_NOARGS, "poll() -> (batches, slow, others, events)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rtp._fastrtp.Receiver",
    .tp_basicsize = sizeof(Receiver),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Receiver_traverse,
    .tp_clear = (inquiry)Receiver_clear,
    .tp_doc = "Reads an epoll set's sockets; takes in-order G.711 packets of armed legs.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Receiver_init,
    .tp_dealloc = (destructor)Receiver_dealloc,
    .tp_methods = Receiver_methods,
};

/* The odd outputs of `rtp.resample.upsample_rows` without BLAS: for each row of `samples`
 * (float64 holding int16 values, `history + n` per row, history = taps - 1) the output
 * pair j is (samples[j + taps/2 - 1], round(sum_k samples[j + k] * taps[k] * scale)).
 * The taps are integers in float64, so every product and partial sum is an integer below
 * 2^53 (checked by `rtp.resample.fixed_point_taps`) and exact: the sum is the same in this
 * loop's order as in any BLAS kernel's. Scaling by a power of two, rint (round half to even,
 * the default rounding mode, as numpy's rint) and clipping to int16 then match the numpy
 * path bit for bit. Outputs are computed UPSAMPLE_BLOCK at a time with the taps in the
 * outer loop, so the inner loop runs over independent accumulators (vectorizable without
 * reassociating any sum). */
#define UPSAMPLE_BLOCK 64

/* Where the compiler can, the row loop is built twice, for plain x86-64 and for AVX2 + FMA,
 * and the loader picks the one the CPU runs (glibc ifuncs; the products and sums are exact, so an FMA
 * changes no bit). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define UPSAMPLE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define UPSAMPLE_INLINE static inline __attribute__((always_inline))
#else
#define UPSAMPLE_CLONES
#define UPSAMPLE_INLINE static inline
#endif

/* acc[j] = sum_k window[j + k] * taps[k] for j < count; count == UPSAMPLE_BLOCK is the common
 * case, with a trip count the compiler knows, so it vectorizes at -O2. With symmetric taps
 * the two samples that share a tap are added first (exact: an integer below 2^16), halving
 * the multiplications; the sums stay within the same bound. */
UPSAMPLE_INLINE void block_sums(const double *restrict window, Py_ssize_t count, const double *restrict taps,
                                Py_ssize_t ntaps, int symmetric, double *restrict acc) {
    if (count == UPSAMPLE_BLOCK && symmetric) {
        for (int j = 0; j < UPSAMPLE_BLOCK; j++) {
            acc[j] = 0.0;
        }
        for (Py_ssize_t k = 0; k < ntaps / 2; k++) {
            const double tap = taps[k];
            const double *left = window + k;
            const double *right = window + ntaps - 1 - k;
            for (int j = 0; j < UPSAMPLE_BLOCK; j++) {
                acc[j] += (left[j] + right[j]) * tap;
            }
        }
        return;
    }
    if (count == UPSAMPLE_BLOCK) {
        for (int j = 0; j < UPSAMPLE_BLOCK; j++) {
            acc[j] = 0.0;
        }
        for (Py_ssize_t k = 0; k < ntaps; k++) {
            const double tap = taps[k];
            const double *column = window + k;
            for (int j = 0; j < UPSAMPLE_BLOCK; j++) {
                acc[j] += column[j] * tap;
            }
        }
        return;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        acc[j] = 0.0;
    }
    for (Py_ssize_t k = 0; k < ntaps; k++) {
        const double tap = taps[k];
        const double *column = window + k;
        for (Py_ssize_t j = 0; j < count; j++) {
            acc[j] += column[j] * tap;
        }
    }
}

UPSAMPLE_CLONES
static void upsample_row(const double *in, Py_ssize_t n, const double *taps, Py_ssize_t ntaps, double scale,
                         int16_t *out) {
    double acc[UPSAMPLE_BLOCK];
    Py_ssize_t half = ntaps / 2;
    int symmetric = 1;
    for (Py_ssize_t k = 0; k < half; k++) {
        symmetric &= taps[k] == taps[ntaps - 1 - k];
    }
    for (Py_ssize_t start = 0; start < n; start += UPSAMPLE_BLOCK) {
        Py_ssize_t count = n - start < UPSAMPLE_BLOCK ? n - start : UPSAMPLE_BLOCK;
        const double *window = in + start;
        block_sums(window, count, taps, ntaps, symmetric, acc);
        for (Py_ssize_t j = 0; j < count; j++) {
            double value = rint(acc[j] * scale);
            if (value < -32768.0) {
                value = -32768.0;
            } else if (value > 32767.0) {
                value = 32767.0;
            }
            out[2 * (start + j)] = (int16_t)window[j + half - 1];
            out[2 * (start + j) + 1] = (int16_t)value;
        }
    }
}

static PyObject *fast_upsample_rows(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer samples, taps, out;
    Py_ssize_t rows, n;
    double scale;
    if (!PyArg_ParseTuple(args, "y*nny*dw*", &samples, &rows, &n, &taps, &scale, &out)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t ntaps = taps.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t width = ntaps - 1 + n;
    if (rows < 0 || n < 0 || ntaps < 2 || ntaps % 2 || taps.len != ntaps * (Py_ssize_t)sizeof(double) ||
        samples.len != rows * width * (Py_ssize_t)sizeof(double) ||
        out.len != rows * 2 * n * (Py_ssize_t)sizeof(int16_t)) {
        PyErr_SetString(PyExc_ValueError, "upsample_rows: buffer sizes do not match rows, n and the taps");
        goto done;
    }
    const double *in = samples.buf;
    int16_t *dest = out.buf;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t row = 0; row < rows; row++) {
        upsample_row(in + row * width, n, taps.buf, ntaps, scale, dest + row * 2 * n);
    }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&samples);
    PyBuffer_Release(&taps);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef module_methods[] = {
    {"upsample_rows", fast_upsample_rows, METH_VARARGS,
     "upsample_rows(samples, rows, n, taps, scale, out): float64 (rows, len(taps) - 1 + n) -> int16 (rows, 2n)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "rtp._fastrtp", .m_doc = "The RTP receive fast path and the upsampler's loop.",
    .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastrtp(void) {
    if (PyType_Ready(&ReceiverType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&ReceiverType);
    if (PyModule_AddObject(m, "Receiver", (PyObject *)&ReceiverType) < 0) {
        Py_DECREF(&ReceiverType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
