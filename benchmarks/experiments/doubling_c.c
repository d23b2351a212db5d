// The yardstick for small allreduces between simulated hosts: recursive doubling over plain
// TCP sockets, one process per host. Usage: doubling_c RANK N MODE ITERS BYTES IP0..IP(N-1),
// MODE 0 = poll with MSG_DONTWAIT + sched_yield, 1 = block in poll, 2 = spin 20 us then
// block, 3 = as 0 but also peeking at every other socket per check. Each timed iteration is
// a 64-byte doubling (a barrier) and then one of BYTES; prints the median of the second.
// Run through doubling_loop.py --c MODE.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <poll.h>
#include <time.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
static int fds[8];
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int mode; // 0 yield, 1 block, 2 spin 20us then block
static void rd_all(int fd, char*b, int n){
  int got=0;
  while(got<n){
    int r=recv(fd,b+got,n-got,MSG_DONTWAIT);
    if(r>0){got+=r;continue;}
    if(r==0){fprintf(stderr,"closed\n");exit(1);}
    if(errno!=EAGAIN){perror("recv");exit(1);}
    if(mode==0) sched_yield(); else if(mode==3){ char tmp[1]; for(int q=0;q<8;q++) if(fds[q]>0 && fds[q]!=fd) recv(fds[q],tmp,0,MSG_DONTWAIT|MSG_PEEK); sched_yield(); }
    else if(mode==1){struct pollfd p={fd,POLLIN,0};poll(&p,1,-1);}
    else { double t0=now(); while(now()-t0<20e-6){r=recv(fd,b+got,n-got,MSG_DONTWAIT); if(r>0){got+=r;break;}} if(got<n){struct pollfd p={fd,POLLIN,0};poll(&p,1,-1);} }
  }
}
int main(int argc,char**argv){
  int me=atoi(argv[1]), n=atoi(argv[2]); mode=atoi(argv[3]); int iters=atoi(argv[4]); int sz=atoi(argv[5]);
  // listen on 10.x: ip given as argv[6+i]
  int ls=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(ls,SOL_SOCKET,SO_REUSEADDR,&one,4);
  struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_port=htons(23456); inet_pton(AF_INET,argv[6+me],&a.sin_addr);
  if(bind(ls,(void*)&a,sizeof a)){perror("bind");return 1;} listen(ls,16);
  usleep(300000);
  for(int r=0;r<me;r++){int s=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in b={0}; b.sin_family=AF_INET; b.sin_port=htons(23456); inet_pton(AF_INET,argv[6+r],&b.sin_addr);
    while(connect(s,(void*)&b,sizeof b)){usleep(10000); close(s); s=socket(AF_INET,SOCK_STREAM,0);} write(s,&me,4); fds[r]=s;}
  for(int k=me+1;k<n;k++){int s=accept(ls,0,0); int r; read(s,&r,4); fds[r]=s;}
  for(int r=0;r<n;r++) if(r!=me) setsockopt(fds[r],IPPROTO_TCP,TCP_NODELAY,&one,4);
  char *buf=malloc(sz), *in=malloc(sz); memset(buf,1,sz);
  double *ts=malloc(sizeof(double)*iters);
  for(int it=-200; it<iters; it++){
    double t0=now();
    for(int rep=0; rep<2; rep++){ if(rep==1) t0=now(); for(int d=1; d<n; d<<=1){ int p=me^d; write(fds[p],buf,rep?sz:64); rd_all(fds[p],in,rep?sz:64); } }
    if(it>=0) ts[it]=now()-t0;
  }
  // sort
  for(int i=0;i<iters;i++) for(int j=i+1;j<iters;j++) if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;}
  printf("rank %d mode %d median %.1f us p10 %.1f p90 %.1f\n", me, mode, ts[iters/2]*1e6, ts[iters/10]*1e6, ts[iters*9/10]*1e6);
  return 0;
}
